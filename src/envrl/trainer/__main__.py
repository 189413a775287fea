"""`python -m envrl.trainer`: the same entry point as `trainer`, for `torchrun -m envrl.trainer`."""

from envrl.trainer.main import main

main()
