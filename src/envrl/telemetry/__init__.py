"""What a run tells its user: logging, the metrics sink, the time ledger, the step console and the
progress display."""
