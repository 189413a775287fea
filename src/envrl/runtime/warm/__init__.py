"""Interpreters started once and forked per run, so a run skips its program's imports (docs/adapters.md)."""
