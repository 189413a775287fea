"""The env-server side of envrl imports none of the training stack (its light install has none of it)."""

import subprocess
import sys

HEAVY = ("torch", "vllm", "wandb", "matplotlib", "safetensors")
PROBE = f"""
import importlib.abc, sys
HEAVY = {HEAVY!r}

class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise ModuleNotFoundError(f"{{name}} is not installed in a light venv", name=name)

sys.meta_path.insert(0, Hide())
import envrl.serve.main, envrl.serve.worker, envrl.envs, envrl.envs.adapters.trl
from envrl.envs import load_environment
load_environment("learnable")
print(sorted(m for m in sys.modules if m.split(".")[0] in HEAVY))
"""


def test_the_env_server_and_its_workers_import_without_torch_vllm_or_wandb() -> None:
    """Run where the training stack is hidden (as absent as in the light venv of deps/envs/openenv-count,
    which tests/integration/test_openenv_adapter.py serves from)."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
