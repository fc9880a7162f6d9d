"""``# noqa`` suppressions, as ruff and flake8 spell them.

``# noqa`` alone silences every finding on its line; ``# noqa: PO101, PO2``
silences the listed codes (a listed prefix covers its family). Codes of other
tools in the same comment (``# noqa: E501, PO201``) are allowed. The same
comment works in nginx and YAML files, which also comment with ``#``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from payonce.lint.findings import Finding

__all__ = ["ALL", "apply_noqa", "suppressions"]

ALL = "*"
_NOQA = re.compile(
    r"#\s*noqa(?::[\s]*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.IGNORECASE
)


def suppressions(source: str) -> dict[int, frozenset[str]]:
    """Line number (1-based) to the codes suppressed there (``{"*"}`` for a bare noqa)."""
    found: dict[int, frozenset[str]] = {}
    if "noqa" not in source and "NOQA" not in source:
        return found
    for number, line in enumerate(source.splitlines(), start=1):
        match = _NOQA.search(line)
        if match is None:
            continue
        codes = match.group("codes")
        if codes is None:
            found[number] = frozenset({ALL})
        else:
            found[number] = frozenset(code.upper() for code in re.split(r"[\s,]+", codes) if code)
    return found


def apply_noqa(findings: Iterable[Finding], source: str) -> list[Finding]:
    """The findings not suppressed on their first or last line."""
    table = suppressions(source)
    if not table:
        return list(findings)
    return [finding for finding in findings if not _suppressed(finding, table)]


def _suppressed(finding: Finding, table: dict[int, frozenset[str]]) -> bool:
    for line in {finding.line, finding.end_line or finding.line}:
        codes = table.get(line)
        if codes and (ALL in codes or any(finding.code.startswith(code) for code in codes)):
            return True
    return False
