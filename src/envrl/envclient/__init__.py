"""The client side of env servers, shared by the orchestrator and `rl eval`: an env's config
(`config.py`), its server spawned and supervised or external (`sidecars.py`), a connection that
retries and waits (`handles.py`), and the eval grid both run (`eval_grid.py`)."""
