"""`rl` starts without importing the training stack: torch (~2 s of CPU) is imported by the
processes that use it, or by the launcher only once a run's processes are spawned, never before
`rl` starts anything, and never for `rl eval` or `rl --help`. The orchestrator `rl` spawns never
imports it at start either: it only reads the weights directories and transfer files the
trainer publishes (envrl.transport.files, envrl.transport.transfer_files)."""

import subprocess
import sys

PROBE = """
import importlib, sys
for module in sys.argv[1:]:
    importlib.import_module(module)
print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "vllm")))
"""


def heavy_imports(*modules: str) -> str:
    """The torch and vLLM modules a fresh interpreter holds after importing `modules`."""
    done = subprocess.run([sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_launcher_and_the_light_rl_commands_import_neither_torch_nor_vllm() -> None:
    assert heavy_imports("envrl.launcher.main", "envrl.eval.main") == "[]"


def test_the_orchestrator_starts_without_torch_or_vllm() -> None:
    assert heavy_imports("envrl.orchestrator.main") == "[]"
