"""`python -m envrl.report OUTPUT_DIR`."""

from envrl.report.main import main

main()
