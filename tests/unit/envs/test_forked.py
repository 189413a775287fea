"""run_forked: the child's answer is read as msgpack data, so what a child writes cannot run code in the parent."""

from __future__ import annotations

import asyncio
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envrl.envs.forked import ForkedCallError, run_forked


def forked(fn: Any) -> Any:
    return asyncio.run(run_forked(fn, timeout=30))


class _Planted:
    """Unpickling it creates `path`: proof that the parent ran code the child chose."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.path,))


def test_numbers_lists_and_maps_come_back_and_numpy_scalars_as_python_numbers() -> None:
    assert forked(lambda: [1.5, {"a": [1, "x"]}, None, True]) == [1.5, {"a": [1, "x"]}, None, True]
    value = forked(lambda: [np.float64(0.25), np.int64(3)])
    assert value == [0.25, 3] and type(value[0]) is float and type(value[1]) is int


def test_a_result_that_is_not_data_is_a_forked_call_error_naming_its_type() -> None:
    with pytest.raises(ForkedCallError) as raised:
        forked(lambda: object())
    assert raised.value.type_name == "TypeError" and "object" in str(raised.value)


def test_a_failure_in_the_child_comes_back_with_its_type_and_traceback() -> None:
    def fail() -> None:
        raise ValueError("no luck")

    with pytest.raises(ForkedCallError) as raised:
        forked(fail)
    assert (
        raised.value.type_name == "ValueError"
        and str(raised.value) == "no luck"
        and "fail" in raised.value.child_traceback
    )


def test_a_pickle_written_by_the_child_is_not_unpickled(tmp_path: Path) -> None:
    marker = tmp_path / "code ran in the parent"

    def write_pickle_and_exit() -> None:
        """What code in the child can do: write its own bytes to the answer pipe (the caller's `fd`)."""
        os.write(sys._getframe(1).f_locals["fd"], pickle.dumps(_Planted(marker)))
        os._exit(0)

    with pytest.raises(ForkedCallError) as raised:
        forked(write_pickle_and_exit)
    assert raised.value.type_name == "BadAnswer"
    assert not marker.exists()
