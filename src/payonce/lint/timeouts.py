"""Reading timeout values: one number, ``httpx.Timeout(...)``, a ``(connect, read)`` tuple.

docs/client.md, "The policy": connect timeout short (3-5 s), read timeout long (30-60 s).
A read timeout shorter than a generation gives up on a call the provider
finishes and bills; one number for both makes the connect timeout as long as
the read timeout or the read timeout as short as the connect timeout.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from payonce.lint.names import ModuleNames

__all__ = ["MIN_READ_TIMEOUT", "TimeoutProblem", "check_timeout"]

MIN_READ_TIMEOUT = 30.0

_TIMEOUT_CLASSES = frozenset({"httpx.Timeout", "openai.Timeout", "anthropic.Timeout"})


@dataclass(frozen=True, slots=True)
class TimeoutProblem:
    """What is wrong with one timeout value: a rule code and the reason."""

    code: str
    message: str


def check_timeout(node: ast.expr, names: ModuleNames, where: str) -> TimeoutProblem | None:
    """PO301 (read timeout < 30 s) or PO302 (one number for connect and read), or None."""
    number = names.number(node)
    if number is not None:
        return _single(number, f"{where} timeout={number:g}")
    if isinstance(node, ast.Tuple) and len(node.elts) == 2:
        read = names.number(node.elts[1])
        if read is not None and read < MIN_READ_TIMEOUT:
            return _short(read, f"{where} read timeout {_seconds(read)}")
        return None
    if isinstance(node, ast.Call):
        qualified = names.qualify(node.func) or ""
        if qualified in _TIMEOUT_CLASSES or qualified.endswith("httpx.Timeout"):
            return _httpx_timeout(node, names, where)
        if qualified == "aiohttp.ClientTimeout":
            return _aiohttp_timeout(node, names, where)
    return None


def _httpx_timeout(call: ast.Call, names: ModuleNames, where: str) -> TimeoutProblem | None:
    keywords = {keyword.arg: keyword.value for keyword in call.keywords if keyword.arg}
    default = call.args[0] if call.args else keywords.get("timeout")
    read_node = keywords.get("read", default)
    read = names.number(read_node) if read_node is not None else None
    if read is not None and read < MIN_READ_TIMEOUT:
        return _short(read, f"{where} read timeout {_seconds(read)}")
    if "connect" not in keywords and "read" not in keywords and read is not None:
        return _single(read, f"{where} httpx.Timeout({_seconds(read)})")
    return None


def _aiohttp_timeout(call: ast.Call, names: ModuleNames, where: str) -> TimeoutProblem | None:
    for name in ("total", "sock_read"):
        for keyword in call.keywords:
            value = names.number(keyword.value) if keyword.arg == name else None
            if value is not None and value < MIN_READ_TIMEOUT:
                return _short(value, f"{where} ClientTimeout({name}={_seconds(value)})")
    return None


def _single(seconds: float, what: str) -> TimeoutProblem:
    if seconds < MIN_READ_TIMEOUT:
        return _short(seconds, what)
    return TimeoutProblem(
        "PO302",
        f"{what} is one number for connect and read: a dead host takes {_seconds(seconds)}"
        f" to fail; split it, e.g. httpx.Timeout({_seconds(seconds)}, connect=5)",
    )


def _short(seconds: float, what: str) -> TimeoutProblem:
    return TimeoutProblem(
        "PO301",
        f"{what}: a generation still running after {_seconds(seconds)} is finished and billed"
        " anyway, and the retry pays again; use a read timeout of at least 30-60 s,"
        " e.g. httpx.Timeout(60, connect=5)",
    )


def _seconds(value: float) -> str:
    return f"{value:g}s" if value != int(value) else f"{int(value)}s"
