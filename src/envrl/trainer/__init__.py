"""The trainer process: batch files in, HF weights and checkpoints out (see docs/trainer.md)."""
