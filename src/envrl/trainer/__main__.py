from envrl.trainer.main import main

main()
