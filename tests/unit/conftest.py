"""Fixtures shared by unit tests."""

from collections.abc import Iterator

import pytest


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """The process computes with one torch thread (a CPU role's start-up count beside vLLM on
    a 2-core box); its thread count is restored after the test."""
    import torch  # only the tests that ask for it pay the import

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
