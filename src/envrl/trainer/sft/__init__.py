"""`rl sft`: supervised fine-tuning on demonstrations, with the RL trainer's model and packing (docs/trainer.md)."""
