"""Recognising LLM generation calls and what they send.

A call is an LLM generation call when it is:

- a generation method (``chat.completions.create``, ``messages.create``,
  ``responses.create``, LangChain ``invoke``...) reached through a client the
  module constructs, or through an unknown receiver for the spellings only
  the OpenAI/Anthropic APIs use;
- ``litellm.completion``/``acompletion``/``text_completion``/``responses``;
- openai<1.0 ``openai.ChatCompletion.create``/``Completion.create``;
- a plain HTTP ``post`` (requests, httpx, aiohttp) to an LLM URL.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

from payonce.lint.keypaths import Coverage, KeyPaths, headers_coverage
from payonce.lint.names import ModuleNames, dotted
from payonce.lint.sdk import (
    GENERATION_SUFFIXES,
    UNKNOWN_ANTHROPIC_SUFFIXES,
    ClientInfo,
    ClientKind,
    has_key_header,
    key_value,
    looks_like_llm_url,
)

__all__ = ["KeyPathLookup", "KeyState", "LlmCall", "SpreadLookup", "recognise"]

_LITELLM_FUNCTIONS = frozenset(
    {
        "litellm.completion",
        "litellm.acompletion",
        "litellm.text_completion",
        "litellm.atext_completion",
        "litellm.responses",
        "litellm.aresponses",
    }
)
_LEGACY_OPENAI = frozenset(
    {
        "openai.ChatCompletion.create",
        "openai.ChatCompletion.acreate",
        "openai.Completion.create",
        "openai.Completion.acreate",
    }
)
_RESPONSE_WRAPPERS = frozenset({"with_raw_response", "with_streaming_response"})
_LLM_ROOTS = frozenset(
    {"openai", "anthropic", "litellm", "langchain", "langchain_openai", "langchain_anthropic"}
)


class KeyState(Enum):
    """Whether a call sends an idempotency key it chose itself."""

    EXPLICIT = "explicit"  # an Idempotency-Key header the code sets
    NONE = "none"  # certainly no header set by the code
    PARTIAL = "partial"  # set on some paths to the call only: the others send none
    UNKNOWN = "unknown"  # headers built elsewhere (**kwargs, a variable): not judged


@dataclass(frozen=True, slots=True)
class LlmCall:
    """One generation call: what it is, the client behind it, its key and timeout.

    ``what`` is how messages name the call: ``chat.completions.create()``,
    ``litellm.completion()``, ``requests.post('https://.../v1/chat/completions')``.
    """

    node: ast.Call
    what: str
    client: ClientInfo | None
    sdk_attempts: int | None
    sdk_detail: str
    key: KeyState
    key_expr: ast.expr | None
    timeout: ast.expr | None
    # The part of an unknown ``sdk_attempts`` the linter could read (LiteLLM's num_retries).
    sdk_floor: int = 1
    # For PARTIAL: the branch condition of the unkeyed path, when one test decides it.
    key_missing: str | None = None

    @property
    def unkeyed(self) -> bool:
        """Some path to the call certainly sends no key of the code's own."""
        return self.key is KeyState.NONE or self.key is KeyState.PARTIAL

    @property
    def key_gap(self) -> str:
        """Where the key is missing, for messages: "" when it is missing everywhere."""
        if self.key is not KeyState.PARTIAL:
            return ""
        if self.key_missing is not None:
            return f" on the path where {self.key_missing}"
        return " on some of the paths that reach it (the key is not set on every path)"

    @property
    def sends_sdk_key(self) -> bool:
        return self.client is not None and self.client.sends_sdk_key

    @property
    def label(self) -> str:
        return self.client.label if self.client is not None else self.what


# (client expression) -> the client it holds, and (name) -> the value last assigned to it.
ClientLookup = Callable[[ast.expr], ClientInfo | None]
ValueLookup = Callable[[str], tuple[ast.expr | None, frozenset[str]]]
# (call, headers name) -> on which paths to the call the name holds a key; None: cannot tell.
KeyPathLookup = Callable[[ast.Call, str], KeyPaths | None]


# (call, name of a **spread) -> the keywords it passes; None: cannot tell.
SpreadLookup = Callable[[ast.Call, str], list[ast.keyword] | None]


def _no_paths(call: ast.Call, name: str) -> KeyPaths | None:
    return None


def _no_spread(call: ast.Call, name: str) -> list[ast.keyword] | None:
    return None


def recognise(
    call: ast.Call,
    names: ModuleNames,
    client_of: ClientLookup,
    value_of: ValueLookup,
    key_paths: KeyPathLookup = _no_paths,
    spread: SpreadLookup = _no_spread,
) -> LlmCall | None:
    """The :class:`LlmCall` that ``call`` is, or None.

    ``f(**kwargs)`` with a ``kwargs`` the function builds itself is read as the
    keywords it holds (:mod:`payonce.lint.spread`).
    """
    llm = _recognise(_spelled_out(call, spread), names, client_of, value_of)
    if llm is None:
        return None
    return _on_every_path(replace(llm, node=call), names, key_paths)


def _spelled_out(call: ast.Call, spread: SpreadLookup) -> ast.Call:
    """``call`` with each readable ``**name`` replaced by the keywords it passes."""
    if not _has_double_star(call):
        return call
    keywords: list[ast.keyword] = []
    for keyword in call.keywords:
        if keyword.arg is None and isinstance(keyword.value, ast.Name):
            found = spread(call, keyword.value.id)
            if found is None:
                return call
            keywords += found
        elif keyword.arg is None:
            return call
        else:
            keywords.append(keyword)
    spelled = ast.Call(func=call.func, args=call.args, keywords=keywords)
    return ast.copy_location(spelled, call)


def _recognise(
    call: ast.Call, names: ModuleNames, client_of: ClientLookup, value_of: ValueLookup
) -> LlmCall | None:
    qualified = _litellm_alias(names.qualify(call.func))
    if qualified in _LITELLM_FUNCTIONS:
        return _litellm(call, qualified, names, value_of)
    if qualified in _LEGACY_OPENAI:
        return _build(call, f"{qualified}()", None, 1, "openai<1.0 does not retry", names, value_of)
    if isinstance(call.func, ast.Attribute):
        if call.func.attr == "post":
            return _http_post(call, names, value_of)
        return _method_call(call, names, client_of, value_of)
    return None


def _litellm_alias(qualified: str | None) -> str | None:
    """``aider.llm.litellm.completion`` -> ``litellm.completion``.

    aider imports LiteLLM through a lazy wrapper, ``from aider.llm import litellm``:
    a module imported as ``litellm`` is taken to be LiteLLM.
    """
    if qualified is None:
        return None
    parts = qualified.split(".")
    if len(parts) > 2 and parts[-2] == "litellm":
        return "litellm." + parts[-1]
    return qualified


def _method_call(
    call: ast.Call, names: ModuleNames, client_of: ClientLookup, value_of: ValueLookup
) -> LlmCall | None:
    node: ast.expr = call.func
    suffix: list[str] = []
    candidates: list[tuple[ast.expr, str]] = []
    while isinstance(node, ast.Attribute):
        if node.attr not in _RESPONSE_WRAPPERS:
            suffix.insert(0, node.attr)
        node = node.value
        candidates.append((node, ".".join(suffix)))
    for base, method in candidates:
        client = client_of(base)
        if client is not None and method in GENERATION_SUFFIXES[client.kind]:
            return _from_client(call, method, client, names, value_of)
    if not names.imported_roots & _LLM_ROOTS:
        return None
    for base, method in candidates:
        anthropic = "anthropic" in names.imported_roots and method in UNKNOWN_ANTHROPIC_SUFFIXES
        if method in GENERATION_SUFFIXES[ClientKind.UNKNOWN] or anthropic:
            name = dotted(base) or "(expression)"
            unknown = ClientInfo(ClientKind.UNKNOWN, name, 0, None, False)
            return _from_client(call, method, unknown, names, value_of)
    return None


def _from_client(
    call: ast.Call, method: str, client: ClientInfo, names: ModuleNames, value_of: ValueLookup
) -> LlmCall:
    return _build(
        call, f"{method}()", client, client.sdk_attempts, client.describe_retries(), names, value_of
    )


def _litellm(call: ast.Call, qualified: str, names: ModuleNames, value_of: ValueLookup) -> LlmCall:
    keywords = {keyword.arg: keyword.value for keyword in call.keywords if keyword.arg}
    factors: list[int | None] = []
    details: list[str] = []
    for name in ("num_retries", "max_retries"):
        if name in keywords:
            retries = names.integer(keywords[name])
            factors.append(None if retries is None else retries + 1)
            details.append(f"{name}={retries if retries is not None else '?'}")
    if "max_retries" not in keywords:
        # LiteLLM hands max_retries to the provider SDK; its default varies by
        # provider and release, so it is unknown rather than guessed.
        factors.append(None)
        details.append("max_retries not set: provider SDK retries unknown")
    floor = 1
    for factor in factors:
        floor *= factor or 1
    attempts = None if None in factors else floor
    llm = _build(call, f"{qualified}()", None, attempts, ", ".join(details), names, value_of)
    return replace(llm, sdk_floor=floor)


def _http_post(call: ast.Call, names: ModuleNames, value_of: ValueLookup) -> LlmCall | None:
    url_node = call.args[0] if call.args else None
    for keyword in call.keywords:
        if keyword.arg == "url":
            url_node = keyword.value
    url = _string_or_assigned(url_node, names, value_of)
    if url is None or not looks_like_llm_url(url):
        return None
    what = f"{dotted(call.func) or 'post'}({url!r})"
    # requests/httpx/aiohttp do not re-send a POST by themselves.
    return _build(call, what, None, 1, "no HTTP-level retries", names, value_of)


def _string_or_assigned(
    node: ast.expr | None, names: ModuleNames, value_of: ValueLookup
) -> str | None:
    text = names.string(node)
    if text is None and isinstance(node, ast.Name):
        value, _ = value_of(node.id)
        text = names.string(value)
    return text


def _build(
    call: ast.Call,
    what: str,
    client: ClientInfo | None,
    attempts: int | None,
    detail: str,
    names: ModuleNames,
    value_of: ValueLookup,
) -> LlmCall:
    key, key_expr = _key(call, names, value_of)
    if key is KeyState.NONE and client is not None and client.default_key:
        key = KeyState.EXPLICIT
    timeout = None
    for keyword in call.keywords:
        if keyword.arg in {"timeout", "request_timeout"}:
            timeout = keyword.value
    return LlmCall(call, what, client, attempts, detail, key, key_expr, timeout)


def _on_every_path(llm: LlmCall, names: ModuleNames, key_paths: KeyPathLookup) -> LlmCall:
    """``llm`` with its key judged per path when its headers are chosen by a branch.

    ``_key`` answers for the headers as last assigned; a key set in one branch
    of an ``if`` (or in one arm of ``a if c else b``) leaves the other path
    unkeyed. Only a definite answer replaces ``_key``'s: "cannot tell" keeps it.
    """
    if llm.key is KeyState.UNKNOWN and _has_double_star(llm.node):
        return llm  # **kwargs may carry the key whatever the headers say
    coverages: list[KeyPaths] = []
    for keyword in llm.node.keywords:
        if keyword.arg == "idempotency_key":
            return llm
        if keyword.arg in {"extra_headers", "headers"}:
            value = keyword.value
            found = (
                key_paths(llm.node, value.id)
                if isinstance(value, ast.Name)
                else headers_coverage(value, names)
            )
            if found is None:
                return llm
            coverages.append(found)
    if not coverages:
        return llm
    if any(found.coverage is Coverage.EVERY for found in coverages):
        key = KeyState.EXPLICIT
    elif any(found.coverage is Coverage.SOME for found in coverages):
        key = KeyState.PARTIAL
    else:
        key = KeyState.NONE
    if key is not KeyState.EXPLICIT and llm.client is not None and llm.client.default_key:
        key = KeyState.EXPLICIT  # default_headers carry a key on every path
    if key is llm.key:
        return llm
    partial = [found.missing for found in coverages if found.coverage is Coverage.SOME]
    missing = partial[0] if len(partial) == 1 else None
    # A key found only on some paths has no single expression to check for PO203.
    return replace(llm, key=key, key_expr=None, key_missing=missing)


def _has_double_star(call: ast.Call) -> bool:
    return any(keyword.arg is None for keyword in call.keywords)


def _key(
    call: ast.Call, names: ModuleNames, value_of: ValueLookup
) -> tuple[KeyState, ast.expr | None]:
    state = KeyState.NONE
    for keyword in call.keywords:
        if keyword.arg is None:
            state = KeyState.UNKNOWN  # **kwargs may carry extra_headers
        elif keyword.arg == "idempotency_key":
            return KeyState.EXPLICIT, keyword.value
        elif keyword.arg in {"extra_headers", "headers"}:
            found, expr = _headers_key(keyword.value, names, value_of)
            if found is KeyState.EXPLICIT:
                return found, expr
            if found is KeyState.UNKNOWN:
                state = KeyState.UNKNOWN
    return state, None


def _headers_key(
    headers: ast.expr, names: ModuleNames, value_of: ValueLookup
) -> tuple[KeyState, ast.expr | None]:
    extra_keys: frozenset[str] = frozenset()
    if isinstance(headers, ast.Name):
        value, extra_keys = value_of(headers.id)
        if any(key.lower() in {"idempotency-key", "x-idempotency-key"} for key in extra_keys):
            return KeyState.EXPLICIT, None
        if value is None:
            return KeyState.UNKNOWN, None
        headers = value
    found = has_key_header(headers, names)
    if found is None:
        return KeyState.UNKNOWN, None
    if found:
        return KeyState.EXPLICIT, key_value(headers, names)
    return KeyState.NONE, None
