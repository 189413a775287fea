"""Support code shared by the tests and the scripts under scripts/ (benches, chaos runs).

Guarantee: nothing here imports from scripts/ or from a test module, so scripts may import it
(`from tests.support.ports import free_port`) without pulling in pytest or a test's fixtures.
"""
