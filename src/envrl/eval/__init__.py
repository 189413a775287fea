"""`rl eval`: evaluate a served model on environments without training."""
