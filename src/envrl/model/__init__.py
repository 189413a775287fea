"""The policy's client library (token-in/token-out calls, the env model clients, chat templates, tool-call parsing),
imported by env workers, orchestrator and trainer; it never starts vLLM (`envrl.inference` does)."""
