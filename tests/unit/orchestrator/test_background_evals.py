"""A background eval that fails stops the loop: its failure is raised at the next step."""

import asyncio

import pytest

from envrl.orchestrator.background_evals import BackgroundEvals


def test_a_background_eval_that_fails_is_raised_and_forgotten() -> None:
    """An eval runs beside training; its failure (an eval env server that stayed down) must not vanish."""

    async def failing_eval() -> None:
        raise RuntimeError("eval env 'e': the env server did not answer again")

    async def scenario() -> None:
        evals = BackgroundEvals()
        task = evals.start(failing_eval())
        evals.raise_failure()  # not finished yet: nothing to raise
        await asyncio.gather(task, return_exceptions=True)
        assert len(evals) == 0
        evals.raise_failure()

    with pytest.raises(RuntimeError, match="did not answer again"):
        asyncio.run(scenario())


def test_waiting_for_background_evals_raises_the_first_failure() -> None:
    async def succeeding_eval() -> None:
        await asyncio.sleep(0)

    async def failing_eval() -> None:
        await asyncio.sleep(0)
        raise ValueError("first")

    async def scenario() -> None:
        evals = BackgroundEvals()
        evals.start(succeeding_eval())
        evals.start(failing_eval())
        await evals.wait()

    with pytest.raises(ValueError, match="first"):
        asyncio.run(scenario())
