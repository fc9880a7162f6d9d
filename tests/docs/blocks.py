"""The fenced code blocks of docs/*.md, and the marker lines in front of them.

A block is run either by the generic runner of tests/docs/test_blocks.py (by its
language) or by the test its marker names::

    <!-- run by tests/PATH.py: NAME -->      the test runs the block's text
    <!-- checked by tests/PATH.py: NAME -->  it cannot run here (a cloud service,
                                             root, a container registry): the test
                                             checks it as far as this machine allows

Such a test reads the block with :func:`block` (or docs/recipes.md's recipes
with tests/recipes/conftest.py's ``recipe``). Other markers steer the generic
runner; docs/development.md ("Docs code blocks") lists them all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# docs/benchmarks.md is being rewritten elsewhere; reference pages are generated
# from the code (their blocks are the code's own output).
SKIPPED = ("benchmarks.md", "benchmarks-archive.md")
SKIPPED_DIRS = ("reference", "hooks")

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^`]*)$")
COMMENT = re.compile(r"^ *<!--\s*(.*?)\s*-->$")
NAMED = re.compile(r"^(run by|checked by) (tests/\S+\.py): ([\w-]+)$")


@dataclass(frozen=True)
class Block:
    page: str  # "client.md"
    line: int  # of the opening fence, 1-based
    lang: str  # "python", "sh", "" ...
    text: str  # the block's lines, the fence's indentation removed
    markers: tuple[str, ...]  # the <!-- ... --> lines right above it, top to bottom
    heading: str  # the nearest heading above it

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    def marker(self, prefix: str) -> str | None:
        """The text after ``prefix`` of this block's marker that starts with it."""
        for marker in self.markers:
            if marker.startswith(prefix):
                return marker[len(prefix) :].strip()
        return None

    @property
    def named(self) -> tuple[str, str, str] | None:
        """(kind, test file, name) of a ``run by`` / ``checked by`` marker."""
        for marker in self.markers:
            if match := NAMED.match(marker):
                kind, test, name = match.groups()
                return kind, test, name
        return None


def pages() -> list[Path]:
    return sorted(
        path
        for path in DOCS.rglob("*.md")
        if path.name not in SKIPPED
        and not any(part in SKIPPED_DIRS for part in path.relative_to(DOCS).parts[:-1])
    )


def page_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    heading = ""
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        opening = FENCE.match(line)
        if opening is None:
            index += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        assert end < len(lines), f"{path.name}:{index + 1}: a code block never closed"
        markers: list[str] = []
        above = index - 1
        while above >= 0 and (comment := COMMENT.match(lines[above])):
            markers.insert(0, comment[1])
            above -= 1
        text = "".join(body[indent:] + "\n" for body in lines[index + 1 : end])
        name = str(path.relative_to(DOCS))
        lang = opening["info"].strip().split(" ")[0]
        found.append(Block(name, index + 1, lang, text, tuple(markers), heading))
        index = end + 1
    return found


def all_blocks() -> list[Block]:
    return [found for path in pages() for found in page_blocks(path)]


def named_blocks() -> dict[str, Block]:
    named: dict[str, Block] = {}
    for found in all_blocks():
        if found.named is not None:
            name = found.named[2]
            assert name not in named, f"two blocks named {name}: {named[name].id}, {found.id}"
            named[name] = found
    return named


def block(name: str) -> str:
    """The text of the block whose ``run by`` / ``checked by`` marker says ``name``."""
    return named_blocks()[name].text
