"""vLLM's `weight_versions` spans become one policy step per generated token, or an error."""

import pytest

from envrl.inference.reload import UNLABELLED
from envrl.model.inference import InferenceError, token_policy_steps


def test_spans_become_a_policy_step_per_token_and_unlabelled_weights_none() -> None:
    spans = [{"version": "default", "start": 0, "end": 2}, {"version": "7", "start": 2, "end": 5}]
    assert token_policy_steps(spans, 5) == [None, None, 7, 7, 7]
    assert token_policy_steps([{"version": UNLABELLED, "start": 0, "end": 1}], 1) == [None]
    assert token_policy_steps(None, 3) is None


def test_spans_that_do_not_cover_the_tokens_are_an_error() -> None:
    with pytest.raises(InferenceError, match="cover 2 tokens, not 3"):
        token_policy_steps([{"version": "1", "start": 0, "end": 2}], 3)
    with pytest.raises(InferenceError, match="do not tile"):
        token_policy_steps([{"version": "1", "start": 1, "end": 3}], 3)
