"""`rl`: the launcher that starts and supervises a whole run."""
