"""The README is a landing page: at most 8 KB, and every relative link in it lands.

The changelog is one line per entry, under dated sections.

A link lands when its file is in the repository and, for ``#anchor``, a heading of
that file has that GitHub anchor (lower case, punctuation dropped, spaces as ``-``).
docs/design.md, the page the README and the code cite for the design, is checked too.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _repo_links_hook() -> ModuleType:
    """docs/hooks/repo_links.py, whose anchor rule the docs site checks its links with."""
    path = ROOT / "docs" / "hooks" / "repo_links.py"
    spec = importlib.util.spec_from_file_location("payonce_docs_repo_links", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# One rule for the README's links and the docs site's: GitHub's heading anchors.
_anchors: Callable[[str], set[str]] = _repo_links_hook().github_anchors


def _relative_links(page: Path) -> list[str]:
    return [
        link
        for link in LINK.findall(page.read_text())
        if not re.match(r"[a-z]+:", link)  # https:, mailto:
    ]


def test_the_readme_is_at_most_8_kb() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 8192, f"README.md is {size} bytes: move details to docs/"


@pytest.mark.parametrize("page", ["README.md", "docs/design.md", "docs/gateway.md"])
def test_every_relative_link_resolves(page: str) -> None:
    source = ROOT / page
    links = _relative_links(source)
    assert links, "no links found: the pattern is wrong"
    broken = []
    for link in links:
        path, _, anchor = link.partition("#")
        target = (source.parent / path).resolve() if path else source
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and anchor not in _anchors(target.read_text()):
            broken.append(f"{link}: no heading #{anchor} in {target.relative_to(ROOT)}")
    assert broken == []


def test_the_anchor_rule_matches_github() -> None:
    assert _anchors("## Failure modes, honestly\n## The gateway's own endpoints\n") == {
        "failure-modes-honestly",
        "the-gateways-own-endpoints",
    }
    assert "payonce-sim-a-simulated-llm-provider" in _anchors(
        "## `payonce sim`: a simulated LLM provider"
    )


def test_the_changelog_is_one_line_entries_under_released_sections() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.MULTILINE)
    assert [name for name, _ in sections][:3] == ["Unreleased", "0.2.0", "0.1.0"]
    assert all(date for name, date in sections if name != "Unreleased")
    # Others add lines under these headings on their branches: they must stay.
    for name in ("Unreleased", "0.2.0"):
        block = text.split(f"## [{name}]", 1)[1].split("\n## [", 1)[0]
        for heading in ("### Added", "### Changed", "### Fixed"):
            assert heading in block, f"[{name}] lacks {heading}"
    lines = text.splitlines()
    for before, line in itertools.pairwise(lines):
        if before.startswith("- "):
            assert not line.startswith("  "), f"an entry goes on past one line: {before[:60]}"


def test_every_serve_flag_is_in_the_flags_section() -> None:
    from payonce.cli import cli

    text = (ROOT / "docs" / "gateway.md").read_text()
    flags = text.split("\n## Flags\n", 1)[1].split("\n## ", 1)[0]
    serve = cli.commands["serve"]
    missing = [
        opt
        for param in serve.params
        for opt in param.opts
        if opt.startswith("--") and opt not in ("--help",) and f"`{opt}" not in flags
    ]
    assert missing == [], "docs/gateway.md, Flags"
