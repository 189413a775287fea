"""CI-sized scripts/chaos/overload.py: 4x capacity from reading clients plus one client that never reads."""

from __future__ import annotations

from scripts.chaos.overload import overload

ANSWER_QUEUE_MIB = 50
"""The server holds at most 2 x 4096 answers for the silent client (~2 MB of `info` answers; measured
growth 1.5 MiB); buffering all of the ~8.6e4 requests a second it sends (~200 B each) would pass
this within 3 s."""


def test_an_overloaded_server_answers_every_reader_and_drops_the_client_that_never_reads() -> None:
    row = overload(seconds=5.0, workers=2, multiplex=4, stall_timeout=1.0)
    assert row.lost == 0 and row.answered > row.capacity, row
    assert row.silent_drops >= 1 and row.silent_requests > 2 * 4096, row
    assert row.rss_peak_mib - row.rss_start_mib < ANSWER_QUEUE_MIB, row
