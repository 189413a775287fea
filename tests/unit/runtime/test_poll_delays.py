"""The readiness-poll schedule `rl` and the orchestrator wait for vLLM with."""

import itertools

from envrl.runtime.http import poll_delays


def test_readiness_polls_start_soon_and_back_off_to_a_bound() -> None:
    """A server up 0.1 s after the spawn is seen then, not at the next whole second; a slow one
    costs at most a poll every `max_s`."""
    assert list(itertools.islice(poll_delays(0.05, 0.5), 7)) == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.5]
