"""`rl` with `inference.replicas = 2`: both vLLM servers serve rollouts and load every step's weights.

What the replicas did is read from their own logs (their access log and the reload plugin's
line), not from the orchestrator; that no rollout used a stale policy is read from the trainer's
mismatch KL. Starts two vLLMs, so it runs under the heavy lock. Measured: 482 s on 2 cores under
a load average of 6 from other work, 401 s of it the two vLLMs starting side by side.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.ports import free_base_port
from tests.support.run_files import metric_lines
from tests.support.smoke import run_to_end

STEPS = 3
RELOADED = re.compile(r"weights reloaded from (\S+)/step_(\d+) in")


def test_every_replica_serves_rollouts_and_loads_every_steps_weights(tmp_path: Path) -> None:
    out = tmp_path / "replicas"
    overrides = [
        "--placement.inference.replicas", "2", "--inference.port", str(free_base_port()),  # base and base + 1 are free
        "--max-steps", str(STEPS), "--max-async-level", "0", "--orchestrator.eval.env", "[]",
    ]  # fmt: skip
    run_to_end(out, *overrides, timeout=1200).check()

    logs = out / "logs"
    for replica in ("inference-0", "inference-1"):
        log = (logs / f"{replica}.log").read_text()
        reloads = [(Path(path), int(step)) for path, step in RELOADED.findall(log)]
        assert reloads == [((out / "weights").resolve(), step) for step in range(1, STEPS)], (replica, reloads)
        assert log.count('"POST /inference/v1/generate HTTP/1.1" 200') > 0, f"{replica} served no rollout"
    assert not (logs / "inference.log").exists()
    # On-policy (max_async_level 0): a rollout sampled by a replica still on the old weights would
    # show as a mismatch between vLLM's and the trainer's logprobs (the step-0 level is < 1e-3).
    kls = [m["trainer/mismatch_kl"] for m in metric_lines(out) if "trainer/mismatch_kl" in m]
    assert len(kls) == STEPS and all(abs(kl) < 1e-3 for kl in kls), kls
    assert "all 2 inference replicas now serve policy 2" in (logs / "orchestrator.log").read_text()
