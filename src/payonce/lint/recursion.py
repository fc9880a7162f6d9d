"""A retry by recursion: an ``except`` handler that calls its own function again.

crewAI's ``Agent.execute_task`` catches an error and returns
``self._handle_execution_error(...)``, which counts attempts on the instance
and returns ``self.execute_task(...)``: a retry loop spelled as recursion. The
handler may call the function directly or through one local helper. The
attempts live in a counter the linter cannot read, so they are unknown.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping

from payonce.lint.names import iter_calls, walk_local
from payonce.lint.retries import RetryLayer

__all__ = ["RECURSION_KIND", "recursion_layer"]

RECURSION_KIND = "recursive call from an except handler"

# (callee expression) -> id of the local function it names, or None.
Resolver = Callable[[ast.expr], int | None]


def recursion_layer(
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    resolve: Resolver,
    functions: Mapping[int, ast.FunctionDef | ast.AsyncFunctionDef],
) -> RetryLayer | None:
    """The layer a function forms when one of its handlers calls it again, or None."""
    for node in walk_local(function.body):
        if not isinstance(node, ast.Try | ast.TryStar):
            continue
        for handler in node.handlers:
            for call in _unconditional_calls(handler.body):
                if _reaches(call, id(function), resolve, functions):
                    return RetryLayer(
                        RECURSION_KIND,
                        call.lineno,
                        None,
                        "attempts counted elsewhere, not readable here",
                        id(function),
                    )
    return None


def _reaches(
    call: ast.Call,
    target: int,
    resolve: Resolver,
    functions: Mapping[int, ast.FunctionDef | ast.AsyncFunctionDef],
) -> bool:
    callee = resolve(call.func)
    if callee is None:
        return False
    if callee == target:
        return True
    helper = functions.get(callee)
    # One helper deep: _handle_execution_error(...) -> return self.execute_task(...).
    return helper is not None and any(
        resolve(inner.func) == target for inner in _unconditional_calls(helper.body)
    )


def _unconditional_calls(body: list[ast.stmt]) -> list[ast.Call]:
    """Calls in ``body``'s own statements, not under an ``if``, loop or nested ``try``.

    crewAI's ``LLM.call`` re-calls itself only ``if unsupported_stop:``, after a
    400 that billed nothing and with ``stop`` dropped: a fallback for one
    error, not a retry of every failure. A guard that raises first (``if
    attempts > limit: raise``) leaves the call itself unconditional.
    """
    calls: list[ast.Call] = []
    for statement in body:
        if isinstance(
            statement, ast.If | ast.For | ast.AsyncFor | ast.While | ast.Try | ast.TryStar
        ):
            continue
        calls += iter_calls(statement)
    return calls
