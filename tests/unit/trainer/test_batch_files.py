"""The orchestrator -> trainer batch files: exact round trip, atomic, corruption named by path and column."""

import zlib

import msgpack
import pytest

from envrl.data.layout import batch_dir
from envrl.data.samples import BATCH_FILE, BatchError, TrainingSample, read_batch, write_batch
from envrl.runtime.atomic import atomic_dir
from tests.support.samples import synthetic_samples


def test_batch_round_trips_exactly(tmp_path):
    samples = synthetic_samples(5, seed=3, policy_step=2)
    n = len(samples[0].input_ids)  # floats that float32 could not hold must survive too
    samples[0] = samples[0].model_copy(
        update={
            "loss_mask": [0] + [1] * (n - 1),
            "inference_logprobs": [0.0] + [-0.1 / 3] * (n - 1),
            "advantage": 1 / 3,
        }
    )
    path = write_batch(tmp_path, 2, samples)
    assert path == tmp_path / "rollouts" / "step_2" == batch_dir(tmp_path, 2)
    assert read_batch(path) == samples


def test_empty_batch_round_trips(tmp_path):
    assert read_batch(write_batch(tmp_path, 0, [])) == []


def test_batch_dir_appears_only_complete_and_leaves_no_temp_behind(tmp_path):
    write_batch(tmp_path, 0, synthetic_samples(2))
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["step_0"]
    assert [p.name for p in batch_dir(tmp_path, 0).iterdir()] == [BATCH_FILE]


def test_writing_a_step_twice_is_refused(tmp_path):
    write_batch(tmp_path, 1, synthetic_samples(2))
    with pytest.raises(FileExistsError, match="step_1"):
        write_batch(tmp_path, 1, synthetic_samples(3))
    assert len(read_batch(batch_dir(tmp_path, 1))) == 2


def test_a_write_that_fails_midway_publishes_nothing(tmp_path):
    final = tmp_path / "rollouts" / "step_0"
    with pytest.raises(OSError, match="disk full"), atomic_dir(final) as tmp:
        (tmp / BATCH_FILE).write_bytes(b"half")
        raise OSError("disk full")
    assert list((tmp_path / "rollouts").iterdir()) == []


def test_truncated_batch_file_is_reported_with_its_path(tmp_path):
    path = write_batch(tmp_path, 0, synthetic_samples(4))
    file = path / BATCH_FILE
    file.write_bytes(file.read_bytes()[:-20])
    with pytest.raises(BatchError, match=f"{file}.*truncated or corrupt"):
        read_batch(path)


def test_per_token_advantages_round_trip_and_default_to_the_sample_advantage(tmp_path):
    plain, distilled = synthetic_samples(2)
    assert plain.token_advantages == [plain.advantage * m for m in plain.loss_mask]  # old behaviour: one per sample
    per_token = [0.25 * i * m for i, m in enumerate(distilled.loss_mask)]
    distilled = distilled.model_copy(update={"token_advantages": per_token})
    assert read_batch(write_batch(tmp_path, 0, [plain, distilled])) == [plain, distilled]


def test_an_advantage_on_an_untrained_token_is_refused():
    sample = synthetic_samples(1)[0]
    fields = sample.model_dump() | {"token_advantages": [1.0] * len(sample.input_ids)}
    with pytest.raises(ValueError, match="token_advantages must be 0 where loss_mask is 0"):
        TrainingSample(**fields)


COLUMNS = [
    "input_ids",
    "loss_mask",
    "inference_logprobs",
    "policy_steps",
    "token_advantages",
    "lengths",
    "advantage",
    "env",
    "task_idx",
    "policy_step",
    "temperature",
    "top_p",
    "top_k",
]


@pytest.mark.parametrize("column", COLUMNS)
def test_a_flipped_byte_in_any_column_is_named_by_column(tmp_path, column):
    path = write_batch(tmp_path, 0, synthetic_samples(4))
    payload = msgpack.unpackb((path / BATCH_FILE).read_bytes())
    assert sorted(payload["columns"]) == sorted(COLUMNS)
    blob = bytearray(payload["columns"][column])
    blob[len(blob) // 2] ^= 0x01
    payload["columns"][column] = bytes(blob)
    (path / BATCH_FILE).write_bytes(msgpack.packb(payload))
    with pytest.raises(BatchError, match=f"{path / BATCH_FILE}.*checksum mismatch in column '{column}'"):
        read_batch(path)


def test_a_column_without_a_checksum_is_refused(tmp_path):
    path = write_batch(tmp_path, 0, synthetic_samples(2))
    payload = msgpack.unpackb((path / BATCH_FILE).read_bytes())
    payload["columns"]["future_column"] = msgpack.packb([1.0, 1.0])
    (path / BATCH_FILE).write_bytes(msgpack.packb(payload))
    with pytest.raises(BatchError, match="future_column"):
        read_batch(path)


def test_invalid_sample_in_a_batch_names_the_sample(tmp_path):
    path = write_batch(tmp_path, 0, synthetic_samples(3))
    payload = msgpack.unpackb((path / BATCH_FILE).read_bytes())
    task_idx = msgpack.unpackb(payload["columns"]["task_idx"])
    task_idx[2] = "seven"
    payload["columns"]["task_idx"] = msgpack.packb(task_idx)
    payload["crc32"]["task_idx"] = zlib.crc32(payload["columns"]["task_idx"])
    (path / BATCH_FILE).write_bytes(msgpack.packb(payload))
    with pytest.raises(BatchError, match=r"sample 2: task_idx"):
        read_batch(path)


def test_extra_files_are_published_with_the_batch(tmp_path):
    path = write_batch(tmp_path, 3, synthetic_samples(2), extra={"orchestrator.json": b"{}"})
    assert sorted(p.name for p in path.iterdir()) == sorted([BATCH_FILE, "orchestrator.json"])


def test_missing_batch_file_is_reported_with_its_path(tmp_path):
    (tmp_path / "rollouts" / "step_0").mkdir(parents=True)
    with pytest.raises(BatchError, match=f"cannot read batch file {tmp_path}/rollouts/step_0/{BATCH_FILE}"):
        read_batch(batch_dir(tmp_path, 0))


def test_per_token_policy_steps_round_trip_and_are_checked(tmp_path):
    [sample] = synthetic_samples(1, seed=1, policy_step=2)
    steps = [2 + (i % 2) if m else -1 for i, m in enumerate(sample.loss_mask)]
    spanning = sample.model_copy(update={"policy_steps": steps})
    assert read_batch(write_batch(tmp_path, 3, [spanning]))[0].policy_steps == steps
    fields = sample.model_dump() | {"policy_steps": [0] * len(steps)}
    with pytest.raises(ValueError, match="policy_steps must be -1 where loss_mask is 0"):
        TrainingSample(**fields)
    assert TrainingSample(**(fields | {"policy_steps": []})).policy_steps == [2 if m else -1 for m in sample.loss_mask]


def test_a_version_3_batch_without_per_token_advantages_still_reads(tmp_path):
    """A run started before batch format 4 resumes: its files give every trained token the sample's advantage."""
    samples = synthetic_samples(3, seed=1)
    path = write_batch(tmp_path, 0, samples)
    payload = msgpack.unpackb((path / BATCH_FILE).read_bytes(), raw=False)
    del payload["columns"]["token_advantages"], payload["crc32"]["token_advantages"]
    payload["version"] = 3
    (path / BATCH_FILE).write_bytes(msgpack.packb(payload, use_bin_type=True))
    assert read_batch(path) == samples
    payload["version"] = 2
    (path / BATCH_FILE).write_bytes(msgpack.packb(payload, use_bin_type=True))
    with pytest.raises(BatchError, match="version 3 or 4, got 'envrl-batch' version 2"):
        read_batch(path)
