"""Environments written for other frameworks, run unchanged under envrl (docs/adapters.md).

Guarantee: importing this package imports no other framework. `openenv` speaks OpenEnv's
WebSocket protocol itself (no openenv-core needed on envrl's side) and `trl` needs no TRL;
`verifiers` imports verifiers when loaded, which only a `verifiers:<id>` env id does, in the
interpreter of the env's own venv (`project = "deps/envs/<x>"`), never beside torch and vLLM.
"""
