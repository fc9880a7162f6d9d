"""The OpenAI Agents SDK runner's own retries: ``ModelSettings(retry=ModelRetrySettings(...))``.

With ``max_retries`` above 0 and a ``policy``, the runner re-sends a failed
model call itself (openai-agents 0.24: without a policy it schedules no retry
of a stateless request, and ``max_retries=0`` switches every retry off). Each
runner attempt is a new SDK call, so no key minted per SDK call survives it,
and from the second attempt the runner calls the client through
``with_options(max_retries=0)``, a copy that has dropped any
``_idempotency_header``. Measured: ``max_retries=4`` billed one request 5 times.
"""

from __future__ import annotations

import ast

from payonce.lint.names import ModuleNames

__all__ = ["runner_retry_message"]

_MODEL_SETTINGS = frozenset({"agents.ModelSettings", "agents.model_settings.ModelSettings"})


def runner_retry_message(call: ast.Call, names: ModuleNames) -> str | None:
    """The PO201 message for a ``ModelSettings(retry=...)`` that makes the runner retry."""
    if names.qualify(call.func) not in _MODEL_SETTINGS:
        return None
    retry = _keyword(call.keywords, "retry")
    settings = _settings(retry, names) if retry is not None else None
    if settings is None:
        return None
    max_retries, policy = settings
    if policy is None or (isinstance(policy, ast.Constant) and policy.value is None):
        return None  # no policy: the runner does not retry a stateless request
    if max_retries is None or (isinstance(max_retries, ast.Constant) and max_retries.value is None):
        return None  # what an unset budget does with a policy is not read here
    retries = names.integer(max_retries)
    if retries is not None and retries <= 0:
        return None
    attempts = f"{retries + 1} attempts" if retries is not None else "max_retries not a literal"
    return (
        f"ModelSettings(retry=...) makes the Agents SDK runner re-send a failed model call"
        f" ({attempts}): each attempt is a new SDK call with no idempotency key, and from the"
        " second the runner calls the client through with_options(max_retries=0), a copy that"
        " drops client._idempotency_header; every attempt is billed again. Leave retry unset"
        " (or max_retries=0) and let the SDK's own retries be the one layer: behind payonce"
        " the gateway matches them, and `payonce run` (or `import payonce.auto`) keys them"
    )


def _settings(node: ast.expr, names: ModuleNames) -> tuple[ast.expr | None, ast.expr | None] | None:
    """``(max_retries, policy)`` of a ModelRetrySettings call or dict; None if unreadable."""
    if isinstance(node, ast.Call) and (names.qualify(node.func) or "").endswith(
        "ModelRetrySettings"
    ):
        if node.args or any(keyword.arg is None for keyword in node.keywords):
            return None
        return _keyword(node.keywords, "max_retries"), _keyword(node.keywords, "policy")
    if isinstance(node, ast.Dict):
        found: dict[str, ast.expr] = {}
        for key, value in zip(node.keys, node.values, strict=True):
            text = names.string(key) if key is not None else None
            if text is None:
                return None
            found[text] = value
        return found.get("max_retries"), found.get("policy")
    return None


def _keyword(keywords: list[ast.keyword], name: str) -> ast.expr | None:
    for keyword in keywords:
        if keyword.arg == name:
            return keyword.value
    return None
