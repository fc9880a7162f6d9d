"""Helpers for the linter tests: fixture paths and ``# expect: CODE`` annotations."""

from __future__ import annotations

import re
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
_EXPECT = re.compile(r"#\s*expect:\s*((?:PO\d{3}\s*)+)")


def expected_findings(path: Path) -> set[tuple[int, str]]:
    """``(line, code)`` for every ``# expect: PO101 PO201`` comment in a fixture."""
    expected = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = _EXPECT.search(line)
        if match:
            expected |= {(number, code) for code in match.group(1).split()}
    return expected
