"""`rl` starts without importing the training stack: torch (~2 s of CPU) is imported by the
processes that use it, or by the launcher only once a run's processes are spawned, never before
`rl` starts anything, and never for `rl eval` or `rl --help`."""

import subprocess
import sys

PROBE = """
import sys
import envrl.launcher.main, envrl.eval.main
print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "vllm")))
"""


def test_the_launcher_and_the_light_rl_commands_import_neither_torch_nor_vllm() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
