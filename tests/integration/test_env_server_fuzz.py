"""The env server under a CI-sized fuzz (scripts/chaos/fuzz.py): it stays up and answers every frame once.

About 20,000 frames of untyped and type-confused requests to one real server: ~5 s on 2 cores.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from tests.support.env_servers import running_env_server

FUZZ_SCRIPT = Path(__file__).parents[2] / "scripts" / "chaos" / "fuzz.py"
MAX_FRAME_BYTES = 65536


def fuzz_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("envrl_chaos_fuzz", FUZZ_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_twenty_thousand_fuzzed_frames_each_get_one_answer_and_the_server_still_serves(tmp_path: Path) -> None:
    fuzz = fuzz_module()
    args = ["--pool", '{"min_workers": 1, "max_workers": 1}', "--max-frame-bytes", str(MAX_FRAME_BYTES),
            "--timeout", '{"rollout_s": 5, "scoring_s": null}']  # fmt: skip
    with running_env_server(tmp_path, *args, env_id="reverse-text") as server:
        report = fuzz.fuzz(server.address, 20_000, seed=1, max_frame_bytes=MAX_FRAME_BYTES)
        assert server.child.poll() is None, "the server died"
    assert report.frames == 20_000
    assert report.missing == [] and report.extra == [], report.summary()
    assert report.alive, report.summary()
    # The fuzz reached every layer: envelope errors, params errors, real rollouts, oversized frames.
    assert {"bad_request", "unknown_method", "too_large", "ok"} <= set(report.kinds), report.summary()
    assert report.anonymous > 0 and report.kinds["bad_request"] > 5_000, report.summary()
