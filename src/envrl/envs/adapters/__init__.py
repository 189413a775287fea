"""Environments written for other frameworks, served by envrl's env server (docs/adapters.md).

Each adapter module imports its framework at import time; it is loaded only by an env id that
names it (`verifiers:<id>`), in an interpreter where that framework is installed.
"""
