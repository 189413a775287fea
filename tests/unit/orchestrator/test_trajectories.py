"""trace_to_samples: exact masks for single-turn, multi-turn, multi-branch, tool and token-less traces."""

import math

import pytest
from transformers import AutoTokenizer

from envrl.data.traces import Branch, Trace, Turn, TurnTokens, WireTask
from envrl.model.client import SamplingArgs
from envrl.orchestrator.trajectories import SeqLenCounts, TokenBackfill, fit_seq_len, trace_to_samples
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

USER = {"role": "user", "content": "hi"}
REPLY = {"role": "assistant", "content": "yo"}
SAMPLING = SamplingArgs(max_tokens=8, temperature=0.7, top_p=0.9, top_k=5)


def turn(prompt_ids: list[int], completion_ids: list[int], logprobs: list[float] | None = None) -> Turn:
    logprobs = logprobs if logprobs is not None else [-0.1 * (i + 1) for i in range(len(completion_ids))]
    return Turn(
        prompt=[USER],
        response=REPLY,
        tokens=TurnTokens(prompt_ids=prompt_ids, completion_ids=completion_ids, completion_logprobs=logprobs),
    )


def trace(*branches: list[Turn]) -> Trace:
    return Trace(task=WireTask(idx=7), branches=[Branch(turns=list(turns)) for turns in branches], reward=1.0)


def convert(t: Trace, **kwargs):
    return trace_to_samples(t, advantage=0.5, env="e", policy_step=3, sampling=SAMPLING, **kwargs)


def test_single_turn_masks_prompt_and_trains_completion() -> None:
    [sample] = convert(trace([turn([1, 2, 3], [4, 5], [-0.5, -0.25])]))
    assert sample.input_ids == [1, 2, 3, 4, 5]
    assert sample.loss_mask == [0, 0, 0, 1, 1]
    assert sample.inference_logprobs == [0.0, 0.0, 0.0, -0.5, -0.25]
    assert (sample.advantage, sample.env, sample.task_idx, sample.policy_step) == (0.5, "e", 7, 3)


def test_multi_turn_masks_env_tokens_between_completions() -> None:
    # turn 2's prompt = turn 1's prompt + completion + env message tokens (8, 9)
    [sample] = convert(trace([turn([1, 2], [3, 4], [-1.0, -2.0]), turn([1, 2, 3, 4, 8, 9], [5], [-3.0])]))
    assert sample.input_ids == [1, 2, 3, 4, 8, 9, 5]
    assert sample.loss_mask == [0, 0, 1, 1, 0, 0, 1]
    assert sample.inference_logprobs == [0.0, 0.0, -1.0, -2.0, 0.0, 0.0, -3.0]


def test_each_branch_is_its_own_sample() -> None:
    samples = convert(trace([turn([1], [2])], [turn([9, 9], [3, 4])]))
    assert [s.input_ids for s in samples] == [[1, 2], [9, 9, 3, 4]]
    assert [s.loss_mask for s in samples] == [[0, 1], [0, 0, 1, 1]]


def test_turn_that_does_not_extend_starts_a_new_sample() -> None:
    # a compacted context: turn 2's prompt drops token 1, so it cannot extend turn 1
    samples = convert(trace([turn([1, 2], [3]), turn([2, 3, 7], [4])]))
    assert [s.input_ids for s in samples] == [[1, 2, 3], [2, 3, 7, 4]]
    assert [s.loss_mask for s in samples] == [[0, 0, 1], [0, 0, 0, 1]]


def test_sample_without_generated_tokens_is_left_out() -> None:
    assert convert(trace([turn([1, 2], [])])) == []


def test_token_less_turn_without_backfill_is_an_error() -> None:
    t = Trace(task=WireTask(idx=1), branches=[Branch(turns=[Turn(prompt=[USER], response=REPLY)])])
    with pytest.raises(ValueError, match="without tokens"):
        convert(t)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_DIR)


def test_backfill_splits_rendered_chat_at_the_generation_prompt(tokenizer) -> None:
    tool_call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}
    response = {"role": "assistant", "content": "", "tool_calls": [tool_call]}
    t = Trace(task=WireTask(idx=1), branches=[Branch(turns=[Turn(prompt=[USER], response=response)])])
    [sample] = convert(t, backfill=TokenBackfill(tokenizer))
    prompt = tokenizer.apply_chat_template([USER], add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    generated = [tok for tok, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m]
    assert sample.input_ids[: len(prompt_ids)] == prompt_ids
    assert sample.loss_mask[: len(prompt_ids)] == [0] * len(prompt_ids)
    assert tokenizer.decode(generated) == '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><|im_end|>'
    assert all(math.isnan(lp) for lp, m in zip(sample.inference_logprobs, sample.loss_mask, strict=True) if m)


def test_backfilled_turns_extend_one_another(tokenizer) -> None:
    second_prompt = [USER, REPLY, {"role": "user", "content": "again"}]
    t = Trace(
        task=WireTask(idx=1),
        branches=[Branch(turns=[Turn(prompt=[USER], response=REPLY), Turn(prompt=second_prompt, response=REPLY)])],
    )
    [sample] = convert(t, backfill=TokenBackfill(tokenizer))
    generated = tokenizer.decode([tok for tok, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m])
    assert generated == "yo<|im_end|>yo<|im_end|>"


def test_samples_carry_the_sampling_parameters_of_their_rollouts():
    (sample,) = convert(trace([turn([1, 2], [3, 4])]))
    assert (sample.temperature, sample.top_p, sample.top_k) == (0.7, 0.9, 5)


def long_samples():
    # prompt 2 tokens, then 4 generated; prompt 5 tokens, then 1 generated
    return convert(trace([turn([1, 2], [3, 4, 5, 6])], [turn([1, 2, 3, 4, 5], [6])]))


def test_truncation_keeps_the_first_seq_len_tokens_and_drops_samples_left_with_nothing_to_train():
    counts = SeqLenCounts()
    fitted = fit_seq_len(long_samples(), 4, "truncate", counts)
    assert [s.input_ids for s in fitted] == [[1, 2, 3, 4]]
    assert fitted[0].loss_mask == [0, 0, 1, 1] and fitted[0].inference_logprobs == [0.0, 0.0, -0.1, -0.2]
    assert (counts.samples, counts.truncated, counts.dropped, counts.tokens_cut) == (2, 1, 1, 2)


def test_drop_leaves_long_samples_out_and_no_limit_keeps_everything():
    counts = SeqLenCounts()
    assert fit_seq_len(long_samples(), 5, "drop", counts) == []
    assert (counts.truncated, counts.dropped) == (0, 2)
    assert len(fit_seq_len(long_samples(), None, "drop", SeqLenCounts())) == 2
    assert len(fit_seq_len(long_samples(), 6, "drop", SeqLenCounts())) == 2


def test_each_trained_token_keeps_its_own_policy_step_and_logprob() -> None:
    first = turn([1, 2], [3, 4], [-1.0, -2.0])
    first.tokens.completion_policy_steps = [None, 4]  # a reload to policy 4 in the middle of turn 1
    second = turn([1, 2, 3, 4, 8], [5, 6], [-3.0, -4.0])
    second.tokens.completion_policy_steps = [4, 5]
    [sample] = convert(trace([first, second]))
    assert sample.policy_steps == [-1, -1, 3, 4, -1, 4, 5], "unlabelled: the dispatch step given (3)"
    assert sample.inference_logprobs == [0.0, 0.0, -1.0, -2.0, 0.0, -3.0, -4.0]
    assert sample.policy_step == 3


def test_seq_len_cuts_the_policy_steps_with_the_tokens() -> None:
    [sample] = convert(trace([turn([1, 2], [3, 4, 5])]))
    [cut] = fit_seq_len([sample], 4, "truncate", SeqLenCounts())
    assert cut.policy_steps == [-1, -1, 3, 3]
