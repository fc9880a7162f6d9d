"""Application retry layers: decorators, retrying loops and task queues.

Each layer multiplies the number of times one logical call can be sent (and
billed). ``attempts`` is what the linter can read from literals; None means
unknown (a variable) or unbounded (no stop condition), and ``detail`` says which.

Recognised:

- tenacity ``@retry``/``@retry(...)``, ``Retrying``/``AsyncRetrying`` loops and
  ``Retrying(...)(fn)`` calls, with ``stop_after_attempt`` (``|`` and ``&``);
- ``backoff.on_exception``/``on_predicate`` (``max_tries``);
- stamina ``@retry``/``retry_context`` (``attempts``, default 10);
- retrying ``@retry`` (``stop_max_attempt_number``);
- Celery tasks with ``autoretry_for`` or ``self.retry()`` (``max_retries``, default 3);
- any other decorator named like a retry (``@llm_retry_decorator``, ``@with_retries``):
  a layer of unknown attempts, since its definition is usually in another module;
- ``for ... in range(n)``/``itertools.count()``/``while`` loops whose body has
  a ``try`` with a success exit (``return``/``break``) and a handler that goes
  round again (``continue`` or falling through).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from payonce.lint.names import ModuleNames, iter_calls

__all__ = [
    "RetryLayer",
    "decorator_layers",
    "handler_goes_round",
    "loop_layer",
    "retry_wrapper_layer",
]

_TERMINAL = (ast.Raise, ast.Return, ast.Break)
_CUSTOM_RETRY = re.compile(r"^(?!no_|without_|skip_).*retr(y|ies|ying)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class RetryLayer:
    """One retry layer around a call.

    ``region`` identifies the node whose body each attempt re-runs (the
    decorated function, the loop); a key generated inside it is new on every
    attempt.
    """

    kind: str
    line: int
    attempts: int | None
    detail: str
    region: int

    def describe(self) -> str:
        count = f"{self.attempts} attempts" if self.attempts is not None else self.detail
        return f"{self.kind} on line {self.line} ({count})"


def decorator_layers(
    function: ast.FunctionDef | ast.AsyncFunctionDef, names: ModuleNames
) -> list[RetryLayer]:
    """The retry layers a function's decorators put around every call in its body."""
    layers = []
    for decorator in function.decorator_list:
        layer = _decorator_layer(decorator, function, names)
        if layer is not None:
            layers.append(layer)
    # Decorators apply bottom-up: the outermost layer is the first one listed.
    return layers


def retry_wrapper_layer(call: ast.Call, names: ModuleNames) -> RetryLayer | None:
    """``tenacity.retry(...)(fn)``, ``Retrying(...)(fn, ...)``: a layer around ``fn``'s calls."""
    if not isinstance(call.func, ast.Call):
        return None
    inner = call.func
    qualified = names.qualify(inner.func) or ""
    if qualified.endswith(("Retrying", "AsyncRetrying")) and qualified.startswith("tenacity"):
        attempts, detail = _tenacity_stop(inner, names)
        return RetryLayer("tenacity Retrying", call.lineno, attempts, detail, id(call))
    return _decorator_layer(inner, None, names, region=id(call))


def loop_layer(loop: ast.For | ast.AsyncFor | ast.While, names: ModuleNames) -> RetryLayer | None:
    """The retry layer a loop forms, or None when it is an ordinary loop."""
    if isinstance(loop, ast.For | ast.AsyncFor) and isinstance(loop.iter, ast.Call):
        qualified = names.qualify(loop.iter.func) or ""
        if qualified.startswith("tenacity.") and qualified.endswith("Retrying"):
            attempts, detail = _tenacity_stop(loop.iter, names)
            return RetryLayer("tenacity Retrying loop", loop.lineno, attempts, detail, id(loop))
        if qualified == "stamina.retry_context":
            attempts, detail = _stamina_attempts(loop.iter, names)
            return RetryLayer("stamina.retry_context", loop.lineno, attempts, detail, id(loop))
    if not _is_retry_loop(loop, names):
        return None
    attempts, detail = _loop_attempts(loop, names)
    kind = "while-loop retry" if isinstance(loop, ast.While) else "for-loop retry"
    return RetryLayer(kind, loop.lineno, attempts, detail, id(loop))


# 4xx rejections: the provider generated nothing and billed nothing. A loop that
# goes round only after one (litellm re-sending without the params a model
# refused) changes the request and does not re-bill.
_REJECTIONS = frozenset(
    {"UnprocessableEntityError", "BadRequestError", "ContextWindowExceededError"}
)


def handler_goes_round(handler: ast.ExceptHandler) -> bool:
    """Whether an ``except`` block lets its loop run the next iteration."""
    if _only_rejections(handler.type):
        return False
    if any(isinstance(node, ast.Continue) for node in _shallow(handler.body)):
        return True
    return not handler.body or not isinstance(handler.body[-1], _TERMINAL)


def _only_rejections(caught: ast.expr | None) -> bool:
    if caught is None:
        return False
    names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
    return all(
        isinstance(name, ast.Name | ast.Attribute)
        and (name.attr if isinstance(name, ast.Attribute) else name.id) in _REJECTIONS
        for name in names
    )


def _decorator_layer(
    decorator: ast.expr,
    function: ast.FunctionDef | ast.AsyncFunctionDef | None,
    names: ModuleNames,
    *,
    region: int | None = None,
) -> RetryLayer | None:
    call = decorator if isinstance(decorator, ast.Call) else None
    qualified = names.qualify(call.func if call else decorator) or ""
    line = decorator.lineno
    where = region if region is not None else id(function)
    if qualified == "tenacity.retry" or (
        qualified.startswith("tenacity.") and qualified.endswith(".retry")
    ):
        if call is None:
            return RetryLayer("tenacity @retry", line, None, "no stop: retries forever", where)
        attempts, detail = _tenacity_stop(call, names)
        return RetryLayer("tenacity @retry", line, attempts, detail, where)
    if qualified in {"backoff.on_exception", "backoff.on_predicate"} and call is not None:
        tries = _keyword(call, "max_tries")
        if tries is None:
            detail = (
                "no max_tries: bounded by max_time only"
                if _keyword(call, "max_time")
                else ("no max_tries: retries forever")
            )
            return RetryLayer(f"@{qualified}", line, None, detail, where)
        attempts = names.integer(tries)
        return RetryLayer(f"@{qualified}", line, attempts, _unknown(attempts, "max_tries"), where)
    if qualified == "stamina.retry":
        attempts, detail = _stamina_attempts(call, names) if call else (10, "")
        return RetryLayer("@stamina.retry", line, attempts, detail, where)
    if qualified == "retrying.retry":
        stop = _keyword(call, "stop_max_attempt_number") if call else None
        if stop is None:
            return RetryLayer("@retrying.retry", line, None, "no stop: retries forever", where)
        attempts = names.integer(stop)
        return RetryLayer("@retrying.retry", line, attempts, _unknown(attempts, "stop"), where)
    if call is not None and function is not None and _is_celery_task(qualified):
        return _celery_layer(call, function, names, line, where)
    if _CUSTOM_RETRY.search(qualified.rsplit(".", 1)[-1]) and function is not None:
        # A project's own retry decorator (often a tenacity wrapper in another
        # module): a layer whose attempts the linter cannot read from here.
        return RetryLayer(
            f"@{qualified.rsplit('.', 1)[-1]}", line, None, "attempts not readable here", where
        )
    return None


def _is_celery_task(qualified: str) -> bool:
    return qualified.endswith(".task") or qualified.split(".")[-1] == "shared_task"


def _celery_layer(
    call: ast.Call,
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    names: ModuleNames,
    line: int,
    region: int,
) -> RetryLayer | None:
    autoretry = _keyword(call, "autoretry_for") is not None
    first = function.args.args[0].arg if function.args.args else None
    self_retry = first is not None and any(
        isinstance(node.func, ast.Attribute)
        and node.func.attr == "retry"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == first
        for node in iter_calls(function.body)
    )
    if not (autoretry or self_retry):
        return None
    kind = "Celery autoretry_for" if autoretry else "Celery self.retry()"
    given = _keyword(call, "max_retries")
    if given is None:
        return RetryLayer(kind, line, 4, "default max_retries=3", region)
    if isinstance(given, ast.Constant) and given.value is None:
        return RetryLayer(kind, line, None, "max_retries=None: retries forever", region)
    retries = names.integer(given)
    attempts = None if retries is None else retries + 1
    return RetryLayer(kind, line, attempts, _unknown(attempts, "max_retries"), region)


def _tenacity_stop(call: ast.Call, names: ModuleNames) -> tuple[int | None, str]:
    stop = _keyword(call, "stop")
    if stop is None:
        return None, "no stop: retries forever"
    return _stop_attempts(stop, names)


def _stop_attempts(stop: ast.expr, names: ModuleNames) -> tuple[int | None, str]:
    if isinstance(stop, ast.BinOp) and isinstance(stop.op, ast.BitOr | ast.BitAnd):
        left, left_detail = _stop_attempts(stop.left, names)
        right, right_detail = _stop_attempts(stop.right, names)
        known = [value for value in (left, right) if value is not None]
        if isinstance(stop.op, ast.BitOr) and known:
            # a | b stops at whichever comes first.
            return min(known), ""
        if isinstance(stop.op, ast.BitAnd) and len(known) == 2:
            return max(known), ""
        return None, left_detail or right_detail
    if isinstance(stop, ast.Call):
        qualified = names.qualify(stop.func) or ""
        if qualified.endswith("stop_after_attempt") and stop.args:
            attempts = names.integer(stop.args[0])
            return attempts, _unknown(attempts, "stop_after_attempt")
        if qualified.endswith("stop_after_delay"):
            return None, "stop_after_delay: bounded by time only"
    return None, "stop condition not readable"


def _stamina_attempts(call: ast.Call, names: ModuleNames) -> tuple[int | None, str]:
    given = _keyword(call, "attempts")
    if given is None:
        return 10, ""  # stamina's default
    attempts = names.integer(given)
    return attempts, _unknown(attempts, "attempts")


def _is_retry_loop(loop: ast.For | ast.AsyncFor | ast.While, names: ModuleNames) -> bool:
    if isinstance(loop, ast.For | ast.AsyncFor):
        if not isinstance(loop.iter, ast.Call):
            return False
        if names.qualify(loop.iter.func) not in {"range", "itertools.count"}:
            return False
    body = _shallow(loop.body)
    success_exit = any(isinstance(node, ast.Return | ast.Break) for node in body)
    if not success_exit:
        return False
    return any(
        isinstance(node, ast.Try | ast.TryStar)
        and any(handler_goes_round(handler) for handler in node.handlers)
        for node in body
    )


def _loop_attempts(
    loop: ast.For | ast.AsyncFor | ast.While, names: ModuleNames
) -> tuple[int | None, str]:
    if isinstance(loop, ast.While):
        return None, "while loop: attempts not readable"
    assert isinstance(loop.iter, ast.Call)
    if names.qualify(loop.iter.func) == "itertools.count":
        return None, "itertools.count(): retries forever"
    args = [names.integer(arg) for arg in loop.iter.args]
    if len(args) == 1 and args[0] is not None:
        return args[0], ""
    if len(args) == 2 and args[0] is not None and args[1] is not None:
        return max(args[1] - args[0], 0), ""
    return None, "range bound not readable"


def _shallow(statements: list[ast.stmt]) -> list[ast.AST]:
    """Nodes of ``statements`` without entering nested loops or scopes.

    A ``break`` or ``continue`` in a nested loop belongs to that loop.
    """
    stack: list[ast.AST] = list(statements)
    found: list[ast.AST] = []
    while stack:
        node = stack.pop()
        found.append(node)
        if isinstance(node, ast.For | ast.AsyncFor | ast.While):
            stack.extend(node.orelse)
            continue
        stack.extend(
            child
            for child in ast.iter_child_nodes(node)
            if not isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef
            )
        )
    return found


def _keyword(call: ast.Call | None, name: str) -> ast.expr | None:
    if call is None:
        return None
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return None


def _unknown(attempts: int | None, what: str) -> str:
    return "" if attempts is not None else f"{what} not a literal"
