"""envrl: RL post-training with environments served as supervised processes."""
