"""Demonstrations become samples trained on exactly their assistant messages."""

import json
from pathlib import Path

import pytest

from envrl.model.chat_tokens import ChatRenderer
from envrl.trainer.sft.data import DemonstrationError, assistant_mask, load_demonstrations
from tests.support.tiny_chat import TINY_CHAT_DIR as DEFAULT_DIR

RENDERER = ChatRenderer(str(DEFAULT_DIR))
CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "say cat"},
    {"role": "assistant", "content": "cat"},
    {"role": "user", "content": "say dog"},
    {"role": "assistant", "content": "dog"},
]


def trained_text(ids: list[int], mask: list[int]) -> str:
    return RENDERER.tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])


def test_only_assistant_messages_and_their_end_of_turn_are_trained() -> None:
    ids, mask = assistant_mask(RENDERER, CONVERSATION, None, "here")
    assert ids == RENDERER.render(CONVERSATION, None, generation_prompt=False)
    assert trained_text(ids, mask) == "cat<|im_end|>\ndog<|im_end|>\n"


def write(path: Path, *records: object) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_long_conversation_is_cut_and_one_with_nothing_left_to_train_is_dropped(tmp_path: Path) -> None:
    full, _ = assistant_mask(RENDERER, CONVERSATION, None, "here")
    first_answer = RENDERER.render(CONVERSATION[:3], None, generation_prompt=False)
    data = write(tmp_path / "d.jsonl", {"messages": CONVERSATION}, {"messages": CONVERSATION[3:]})
    samples, stats = load_demonstrations(data, RENDERER, seq_len=len(first_answer))
    assert len(full) > len(first_answer)
    assert (stats.conversations, stats.truncated, stats.dropped) == (2, 1, 0)
    assert trained_text(samples[0].input_ids, samples[0].loss_mask) == "cat<|im_end|>\n"

    # Cut right after its prompt, "say dog" has nothing left to train; the short one keeps its answer.
    short = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    cut = len(RENDERER.render(CONVERSATION[3:4], None, generation_prompt=True))
    assert len(RENDERER.render(short, None, generation_prompt=False)) <= cut
    data = write(tmp_path / "e.jsonl", {"messages": CONVERSATION[3:]}, {"messages": short})
    samples, stats = load_demonstrations(data, RENDERER, seq_len=cut)
    assert stats.dropped == 1 and [s.task_idx for s in samples] == [2]
    with pytest.raises(DemonstrationError, match="holds no conversation with an assistant token"):
        load_demonstrations(write(tmp_path / "f.jsonl", {"messages": CONVERSATION[3:]}), RENDERER, seq_len=cut)


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("not json", r"d.jsonl:1: not JSON"),
        ('{"text": "hi"}', r'd.jsonl:1: expected \{"messages"'),
        ('{"messages": [{"role": "bot", "content": "x"}]}', r"d.jsonl:1: message 0 needs a role"),
        ('{"messages": [{"role": "user", "content": "x"}]}', r"d.jsonl:1: no assistant message"),
    ],
)
def test_a_bad_line_names_the_file_line_and_what_is_wrong(tmp_path: Path, line: str, error: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(DemonstrationError, match=error):
        load_demonstrations(path, RENDERER, seq_len=512)


def test_a_missing_file_says_what_the_data_key_wants(tmp_path: Path) -> None:
    with pytest.raises(DemonstrationError, match="no demonstrations file at .*one JSON conversation per line"):
        load_demonstrations(tmp_path / "nope.jsonl", RENDERER, seq_len=512)
