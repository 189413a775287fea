"""The orchestrator: samples tasks, collects Traces from env servers, writes training batches."""
