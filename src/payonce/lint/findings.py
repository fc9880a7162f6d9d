"""What every rule reports: one :class:`Finding` per place in a file."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Finding"]


@dataclass(frozen=True, slots=True, order=True)
class Finding:
    """One problem at one place.

    Lines and columns are 1-based, as editors, ``ruff`` and SARIF count them.
    ``end_line`` is the last line of the reported node: a ``# noqa`` comment on
    either the first or the last line suppresses the finding, so a suppression
    after the closing parenthesis of a multi-line call works.
    """

    path: str
    line: int
    column: int
    code: str
    message: str
    end_line: int = 0
    end_column: int = 0

    def text(self) -> str:
        """The ``path:line:col: CODE message`` form."""
        return f"{self.path}:{self.line}:{self.column}: {self.code} {self.message}"
