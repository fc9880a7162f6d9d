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
            for call in iter_calls(handler.body):
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
        resolve(inner.func) == target for inner in iter_calls(helper.body)
    )
