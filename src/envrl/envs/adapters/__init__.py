"""Environments of other frameworks run unchanged under envrl (docs/adapters.md): importing this package imports no
other framework; verifiers is imported only by a `verifiers:<id>` env, in that env's own venv."""
