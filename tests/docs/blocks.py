"""The command blocks of README.md and docs/*.md, each with the marker that says how CI treats it.

Guarantee: every fenced block a user could take for a command (```bash, ```sh, or unlabelled and
starting like one) has a `<!-- doc: KIND ... -->` marker on the line before it, and the digest of
every command block with its marker is committed in `blocks.lock.json`, so a command that changes
without its check changing fails.
`python -m tests.docs.blocks --update` rewrites the lock (after the block's check was made to fit).
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = Path(__file__).with_name("blocks.lock.json")
COMMAND_LANGS = ("bash", "sh", "shell", "")
"""Fence languages whose blocks may be commands: a bash, sh or shell block always needs a marker, an
unlabelled one when it starts like a command (toml, python, json are excerpts)."""
KINDS = {
    "run": "run by tests/docs/test_run_blocks.py exactly as written, in a scratch checkout",
    "covered": "the same command as a test the suite already runs (`by=` names it)",
    "needs": "needs what CI lacks (`why=` says what: a GPU, a hub, SLURM, hours)",
    "output": "what a command prints, not a command",
    "illustration": "a shape or an excerpt, not meant to be run as it stands",
}
"""What a marker may say of its block."""
STARTS = r"(uv |rl |python|flock |bash |torchrun |env-server |inference |trainer |orchestrator )"
COMMAND = re.compile(rf"^\s*({STARTS}|[A-Z_]+=\S* )")
"""How a command starts: an unlabelled block that starts so needs a marker (one that shows output does not)."""
INDENTED_COMMAND = re.compile(rf"^    {STARTS}")
"""A markdown code block by indentation that starts with a command: it cannot carry a marker."""
COMMANDS = ("run", "covered", "needs")
"""The kinds that are commands a user runs: their digests are locked."""
MARKER = re.compile(r"^<!--\s*doc:\s*(.*?)\s*-->$")
FENCE = re.compile(r"^(\s*)(```+)(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    """1-based line of the opening fence."""
    lang: str
    text: str
    kind: str | None
    """The marker's kind (None: no marker)."""
    options: dict[str, str] = field(default_factory=dict)
    marker: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def covered_by(self) -> list[str]:
        """The files a `covered` block names (`by=a,b`)."""
        return [path for path in self.options.get("by", "").split(",") if path]

    @property
    def digest(self) -> str:
        return hashlib.sha256(f"{self.marker}\n{self.text}".encode()).hexdigest()[:16]


def pages(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def parse(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of `path` with their markers (a marker is the last non-blank line before the fence)."""
    lines = path.read_text().split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            if INDENTED_COMMAND.match(lines[i]) and (i == 0 or not lines[i - 1].strip()):
                blocks.append(Block(str(path.relative_to(root)), i + 1, "indented", lines[i].strip(), None))
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence.group(2)), len(lines))
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        found = MARKER.match(before)
        kind, options = None, {}
        if found:
            words = shlex.split(found.group(1))
            kind = words[0] if words else ""
            options = dict(word.split("=", 1) if "=" in word else (word, "") for word in words[1:])
        indent = len(fence.group(1))
        text = "\n".join(line[indent:] for line in lines[i + 1 : end])
        page = str(path.relative_to(root))
        blocks.append(Block(page, i + 1, fence.group(3), text, kind, options, found.group(1) if found else ""))
        i = end + 1
    return blocks


def all_blocks(root: Path = ROOT) -> list[Block]:
    return [block for page in pages(root) for block in parse(page, root)]


def problems(blocks: list[Block]) -> list[str]:
    """What is wrong with the markers: a command block without one, an unknown kind, a kind missing its option."""
    found = []
    for block in blocks:
        if block.lang == "indented":
            found.append(f"{block.where}: an indented command block: make it a fenced ```bash block with a marker")
        elif block.kind is None:
            if block.lang in COMMAND_LANGS[:-1] or (block.lang == "" and COMMAND.match(block.text)):
                found.append(
                    f"{block.where}: a ```{block.lang} block without a `<!-- doc: KIND -->` marker ({', '.join(KINDS)})"
                )
        elif block.kind not in KINDS:
            found.append(f"{block.where}: unknown marker kind {block.kind!r}; one of {', '.join(KINDS)}")
        elif block.kind == "covered" and not all((ROOT / path).is_file() for path in block.covered_by or [""]):
            found.append(f"{block.where}: `covered` needs by=PATH[,PATH] of the tests that run the same command")
        elif block.kind in ("needs", "illustration") and not block.options.get("why"):
            found.append(f'{block.where}: `{block.kind}` needs why="..." (what CI lacks, or what it shows)')
    return found


def digests(blocks: list[Block]) -> dict[str, list[str]]:
    """Per page, the digest of each command block (run, covered, needs) in order: what `blocks.lock.json` holds."""
    out: dict[str, list[str]] = {}
    for block in blocks:
        if block.kind in COMMANDS:
            out.setdefault(block.page, []).append(f"{block.kind} {block.digest}")
    return out


def main(argv: list[str]) -> None:
    """`--update`: write the lock from the pages as they are now; else print the blocks per page and kind."""
    blocks = all_blocks()
    if argv == ["--update"]:
        LOCK.write_text(json.dumps(digests(blocks), indent=1, sort_keys=True) + "\n")
        print(f"wrote {LOCK.relative_to(ROOT)}")
        return
    for page in dict.fromkeys(block.page for block in blocks):
        kinds = [block.kind or f"{block.lang or 'text'} excerpt" for block in blocks if block.page == page]
        print(page, {kind: kinds.count(kind) for kind in dict.fromkeys(kinds)})


if __name__ == "__main__":
    main(sys.argv[1:])
