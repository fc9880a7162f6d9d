"""The optional dependencies a command needs, checked before it does anything.

After a plain ``pip install payonce`` the demo, reconcile and simulate commands
lack theirs. Each calls :func:`require_extra` first, so that it stops in one
line (exit code 2) naming the extra to install, instead of a
``ModuleNotFoundError`` traceback, or, for the demo, after running its four
stacks for a minute (DuckDB is only used for the reports at the end).
"""

from __future__ import annotations

import importlib

from payonce.errors import ConfigError

__all__ = ["EXTRAS", "require_extra"]

# Each extra of pyproject.toml's [project.optional-dependencies] that a command
# needs, by the names its packages are imported as (here the same as the
# distributions'; tests/test_extras.py compares the two).
EXTRAS: dict[str, tuple[str, ...]] = {
    # The openai SDK on an httpx2 client, rich for the table, DuckDB for the
    # reconcile report of each run.
    "demo": ("duckdb", "httpx2", "openai", "rich"),
    "reconcile": ("duckdb", "rich"),
    "simulate": ("numpy", "rich"),
}


def require_extra(command: str, extra: str) -> None:
    """Import the packages of ``extra``; raise :class:`ConfigError` naming it if one is missing.

    Only a missing package of the extra itself is turned into that line: a
    dependency missing inside one (a broken install) or an ``ImportError`` of
    payonce's own stays a traceback, which is what helps there.
    """
    for name in EXTRAS[extra]:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            raise ConfigError(
                f"payonce {command} needs the {extra} extra ({name} is missing):"
                f" pip install 'payonce[{extra}]'"
            ) from exc
