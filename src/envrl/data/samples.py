"""Training samples, one per Trace branch: per-token lists of equal length, a 0/1 loss mask, and logprobs and
advantages 0 (policy step -1) wherever it is 0; a batch `write_batch` wrote is complete when visible and reads back
equal, or fails with a `BatchError` naming the file."""

from __future__ import annotations

import sys
import zlib
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from envrl.data.layout import batch_dir
from envrl.runtime.atomic import atomic_dir, write_file

TOKEN_FIELDS = ("input_ids", "loss_mask", "inference_logprobs", "policy_steps", "token_advantages")
"""A sample's per-token lists, each with one entry per token of `input_ids`."""


class TrainingSample(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    input_ids: list[int]
    loss_mask: list[int]
    """1 for tokens the policy generated (trained on), 0 for prompt and env/tool tokens."""
    inference_logprobs: list[float]
    """Logprob of each token under the policy that sampled it; 0 where `loss_mask` is 0."""
    advantage: float
    """The rollout's advantage (its group's), which every trained token gets unless
    `token_advantages` says otherwise."""
    env: str
    task_idx: int
    policy_step: int
    """The policy the off-policy bound counts this sample as: the oldest of its tokens' steps
    (with partial rollouts), else the one serving when its rollout was dispatched."""
    policy_steps: list[int] = []
    """Per token, the policy step whose weights sampled it; -1 where `loss_mask` is 0. Left
    empty, every trained token gets `policy_step`."""
    token_advantages: list[float] = []
    """Per token, the advantage the loss weighs it by; 0 where `loss_mask` is 0. Left empty, every
    trained token gets `advantage` (on-policy distillation sets its own: `orchestrator/distill.py`)."""
    temperature: float = 1.0
    """Sampling temperature of the generated tokens: the trainer divides its logits by it, so both
    sides of the importance ratio are the distribution that sampled."""
    top_p: float = 1.0
    """Nucleus of the sampling distribution (1: none); the trainer truncates its own likewise."""
    top_k: int = 0
    """Top-k of the sampling distribution (0: none); the trainer truncates its own likewise."""

    @model_validator(mode="after")
    def _aligned(self) -> TrainingSample:
        n = len(self.input_ids)
        if not self.policy_steps and n:
            self.policy_steps = [self.policy_step if m else -1 for m in self.loss_mask]
        if not self.token_advantages and n:
            self.token_advantages = [self.advantage if m else 0.0 for m in self.loss_mask]
        lengths = {name: len(getattr(self, name)) for name in TOKEN_FIELDS}
        if set(lengths.values()) != {n}:
            raise ValueError(f"per-token fields must all have len(input_ids) = {n} entries; got {lengths}")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask must hold only 0 and 1")
        for name in ("inference_logprobs", "token_advantages"):
            if any(v != 0.0 for v, m in zip(getattr(self, name), self.loss_mask, strict=True) if m == 0):
                raise ValueError(f"{name} must be 0 where loss_mask is 0")
        if any((p != -1) if m == 0 else (p < 0) for p, m in zip(self.policy_steps, self.loss_mask, strict=True)):
            raise ValueError("policy_steps must be -1 where loss_mask is 0 and a step (>= 0) where it is 1")
        if not (self.temperature > 0 and 0 < self.top_p <= 1 and self.top_k >= 0):
            raise ValueError(
                f"sampling of sample must have temperature > 0, 0 < top_p <= 1, top_k >= 0; "
                f"got {self.temperature}, {self.top_p}, {self.top_k}"
            )
        return self


# ---------------------------------------------------------------------------------------------
# Batch files: the orchestrator -> trainer hand-off (format documented in docs/trainer.md)

BATCH_FORMAT = "envrl-batch"
BATCH_VERSION = 4
READABLE_VERSIONS = (3, BATCH_VERSION)
"""Versions `read_batch` takes: 3 had no `token_advantages` column (every trained token got the
sample's `advantage`, which is how a v3 file is read), so a run resumes across the upgrade."""
BATCH_FILE = "batch.msgpack"
_TOKEN_COLUMNS = dict(zip(TOKEN_FIELDS, ("i", "B", "d", "i", "d"), strict=True))
"""Per-token columns: packed little-endian arrays, all samples concatenated, cut by `lengths`."""
_SAMPLE_COLUMNS = tuple(name for name in TrainingSample.model_fields if name not in _TOKEN_COLUMNS)
"""Per-sample columns, one msgpack list each: every other field of `TrainingSample`, so a field
added later is written, read and checksummed without an edit here."""
BATCH_COLUMNS = (*_TOKEN_COLUMNS, "lengths", *_SAMPLE_COLUMNS)
"""Every column of a batch file, in the order they are written."""


class BatchError(ValueError):
    """A batch file that cannot be read; the message names the file and what is wrong with it."""


def _to_bytes(values: list[int] | list[float], typecode: str) -> bytes:
    arr = array(typecode, values)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def _from_bytes(data: bytes, typecode: str) -> list[Any]:
    arr = array(typecode)
    arr.frombytes(data)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tolist()


def write_batch(
    output_dir: Path, step: int, samples: Sequence[TrainingSample], extra: Mapping[str, bytes] | None = None
) -> Path:
    """Write step `step`'s samples atomically to `batch_dir(output_dir, step)` and return it.

    The directory appears only when complete (temp dir, fsync, rename), with the `extra` files
    (name -> content) beside the batch file: what must be published in the same rename (the
    orchestrator's state). Writing a step twice is a FileExistsError, since the trainer may
    already have read the first one. Every column is its own msgpack blob with its own CRC32,
    so a flipped byte is reported by column, whatever columns a later version adds.
    """
    columns: dict[str, Any] = {
        name: _to_bytes([v for s in samples for v in getattr(s, name)], code) for name, code in _TOKEN_COLUMNS.items()
    }
    columns["lengths"] = _to_bytes([len(s.input_ids) for s in samples], "i")
    columns.update({name: [getattr(s, name) for s in samples] for name in _SAMPLE_COLUMNS})
    blobs = {name: msgpack.packb(value, use_bin_type=True) for name, value in columns.items()}
    payload = {
        "format": BATCH_FORMAT,
        "version": BATCH_VERSION,
        "step": step,
        "columns": blobs,
        "crc32": {name: zlib.crc32(blob) for name, blob in blobs.items()},
    }
    final = batch_dir(output_dir, step)
    with atomic_dir(final) as tmp:
        for name, content in {BATCH_FILE: msgpack.packb(payload, use_bin_type=True), **(extra or {})}.items():
            write_file(tmp / name, content)
    return final


def read_batch(path: Path) -> list[TrainingSample]:
    """Samples of the batch in directory `path` (as made by `write_batch`); BatchError if bad.

    Per-sample fields are validated again (a writer of another version may differ); the token
    columns are not checked token by token: `write_batch` wrote them from validated samples and
    each column's CRC32 shows they arrived as written."""
    file = Path(path) / BATCH_FILE
    try:
        payload = msgpack.unpackb(file.read_bytes(), raw=False)
    except OSError as e:
        raise BatchError(f"cannot read batch file {file}: {e}") from None
    except (ValueError, msgpack.UnpackException) as e:
        raise BatchError(f"batch file {file} is not valid msgpack (truncated or corrupt): {e}") from None
    try:
        return _decode(payload)
    except (KeyError, TypeError, ValueError) as e:
        detail = f"missing field {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
        raise BatchError(f"batch file {file} is corrupt or incomplete: {detail}; it was not trained on") from None


def _columns(payload: Any) -> dict[str, Any]:
    """The unpacked columns of a batch payload, each checked against its own CRC32 first."""
    if not isinstance(payload, dict):
        raise ValueError(f"expected a msgpack map, got {type(payload).__name__}")
    if payload.get("format") != BATCH_FORMAT or payload.get("version") not in READABLE_VERSIONS:
        raise ValueError(
            f"expected format {BATCH_FORMAT!r} version {' or '.join(map(str, READABLE_VERSIONS))}, "
            f"got {payload.get('format')!r} version {payload.get('version')!r}"
        )
    blobs, checksums = payload["columns"], payload["crc32"]
    wanted = {*_TOKEN_COLUMNS, "lengths", *_SAMPLE_COLUMNS}
    if payload["version"] == 3:
        wanted.discard("token_advantages")
    if set(blobs) != set(checksums) or not wanted <= set(blobs):
        raise ValueError(f"columns {sorted(blobs)} with checksums for {sorted(checksums)}; expected {sorted(wanted)}")
    for name, blob in blobs.items():
        if not isinstance(blob, bytes) or zlib.crc32(blob) != checksums[name]:
            raise ValueError(f"checksum mismatch in column {name!r}")
    return {name: msgpack.unpackb(blob, raw=False) for name, blob in blobs.items()}


def _decode(payload: Any) -> list[TrainingSample]:
    columns = _columns(payload)
    lengths = _from_bytes(columns["lengths"], "i")
    values = {name: _from_bytes(columns[name], code) for name, code in _TOKEN_COLUMNS.items() if name in columns}
    per_sample = {name: columns[name] for name in _SAMPLE_COLUMNS}
    total = sum(lengths)
    if any(len(v) != total for v in values.values()) or any(len(v) != len(lengths) for v in per_sample.values()):
        raise ValueError(f"column lengths disagree with the {len(lengths)} sample lengths ({total} tokens)")
    samples, start = [], 0
    for i, n in enumerate(lengths):
        end = start + n
        try:  # the per-sample fields; the token columns were validated on write and the CRCs vouch for them
            fields = TrainingSample(**dict.fromkeys(_TOKEN_COLUMNS, []), **{k: c[i] for k, c in per_sample.items()})
        except ValidationError as e:
            error = e.errors()[0]
            raise ValueError(f"sample {i}: {'.'.join(map(str, error['loc']))}: {error['msg']}") from None
        sample = fields.model_copy(update={name: column[start:end] for name, column in values.items()})
        if "token_advantages" not in values:  # a version-3 file: the sample's advantage on every trained token
            sample.token_advantages = [sample.advantage if m else 0.0 for m in sample.loss_mask]
        samples.append(sample)
        start = end
    return samples
