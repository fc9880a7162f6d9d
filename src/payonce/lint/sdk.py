"""What the linter knows about LLM SDKs: client classes, their retry defaults, their calls.

Defaults come from the SDKs' sources: ``openai`` and ``anthropic`` both have
``DEFAULT_MAX_RETRIES = 2`` (3 attempts per call), as do LangChain's
``ChatOpenAI``/``ChatAnthropic`` (which pass ``max_retries`` to those SDKs).
The SDKs mint one idempotency key per call and reuse it on their own retries,
but only send it when ``client._idempotency_header`` is set.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace
from enum import Enum

from payonce.lint.names import ModuleNames, dotted

__all__ = [
    "GENERATION_SUFFIXES",
    "IDEMPOTENCY_HEADERS",
    "LLM_HOST",
    "LLM_PATH",
    "SDK_DEFAULT_RETRIES",
    "UNKNOWN_ANTHROPIC_SUFFIXES",
    "ClientInfo",
    "ClientKind",
    "client_from_annotation",
    "client_from_call",
    "client_kind_of",
    "derive_client",
    "has_key_header",
    "is_deriving_call",
    "key_value",
    "looks_like_llm_url",
    "protected_client",
]

SDK_DEFAULT_RETRIES = 2
IDEMPOTENCY_HEADERS = frozenset({"idempotency-key", "x-idempotency-key"})


class ClientKind(Enum):
    """Families of clients, by how their retries and calls look."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    LANGCHAIN = "langchain"
    LITELLM_ROUTER = "litellm-router"
    UNKNOWN = "unknown"


# (top-level package, class name) -> kind. Submodule paths do not matter:
# ``openai.lib.azure.AzureOpenAI`` and ``openai.AzureOpenAI`` are one class.
_CLIENT_CLASSES: dict[tuple[str, str], ClientKind] = {
    **{
        ("openai", name): ClientKind.OPENAI
        for name in ("OpenAI", "AsyncOpenAI", "AzureOpenAI", "AsyncAzureOpenAI", "Client")
    },
    **{
        ("anthropic", name): ClientKind.ANTHROPIC
        for name in (
            "Anthropic",
            "AsyncAnthropic",
            "AnthropicBedrock",
            "AsyncAnthropicBedrock",
            "AnthropicVertex",
            "AsyncAnthropicVertex",
            "Client",
        )
    },
    **{
        (package, name): ClientKind.LANGCHAIN
        for package in (
            "langchain_openai",
            "langchain_anthropic",
            "langchain_community",
            "langchain",
        )
        for name in ("ChatOpenAI", "AzureChatOpenAI", "ChatAnthropic", "OpenAI", "AzureOpenAI")
    },
    ("litellm", "Router"): ClientKind.LITELLM_ROUTER,
}

# Methods that run (and bill) a generation, after with_raw_response/with_streaming_response.
GENERATION_SUFFIXES: dict[ClientKind, frozenset[str]] = {
    ClientKind.OPENAI: frozenset(
        {
            "chat.completions.create",
            "chat.completions.parse",
            "chat.completions.stream",
            "beta.chat.completions.parse",
            "beta.chat.completions.stream",
            "completions.create",
            "responses.create",
            "responses.parse",
            "responses.stream",
        }
    ),
    ClientKind.ANTHROPIC: frozenset(
        {
            "messages.create",
            "messages.stream",
            "messages.parse",
            "beta.messages.create",
            "beta.messages.stream",
            "completions.create",
        }
    ),
    ClientKind.LANGCHAIN: frozenset(
        {
            "invoke",
            "ainvoke",
            "stream",
            "astream",
            "batch",
            "abatch",
            "generate",
            "agenerate",
            "predict",
            "apredict",
            "predict_messages",
            "apredict_messages",
        }
    ),
    ClientKind.LITELLM_ROUTER: frozenset(
        {"completion", "acompletion", "text_completion", "atext_completion", "responses"}
    ),
}
# A client the linter did not see constructed (a parameter, an attribute set
# elsewhere) is only trusted on calls that no other popular API spells this way.
GENERATION_SUFFIXES[ClientKind.UNKNOWN] = frozenset(
    suffix
    for suffix in GENERATION_SUFFIXES[ClientKind.OPENAI]
    if suffix.startswith(("chat.", "beta.chat.", "responses."))
)
UNKNOWN_ANTHROPIC_SUFFIXES = frozenset(
    {"messages.create", "messages.stream", "beta.messages.create", "beta.messages.stream"}
)

_LABELS = {
    ClientKind.OPENAI: "OpenAI SDK",
    ClientKind.ANTHROPIC: "Anthropic SDK",
    ClientKind.LANGCHAIN: "LangChain",
    ClientKind.LITELLM_ROUTER: "LiteLLM Router",
    ClientKind.UNKNOWN: "LLM",
}


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """A client as constructed in the module (or as far as the linter can tell).

    ``max_retries`` is the SDK's own retry count (attempts = retries + 1); None
    when it is not a literal the linter can read.
    """

    kind: ClientKind
    name: str
    line: int
    max_retries: int | None
    retries_given: bool
    sends_sdk_key: bool = False
    default_key: bool = False
    # LangChain's ``.with_retry()`` wraps the model in an application retry layer.
    wrapper_retries: tuple[tuple[int | None, int], ...] = ()
    # payonce.client.protect(): SDK retries off, the payonce policy retries with one key.
    protected: bool = False
    # Not constructed in the module: "parameter `client: openai.OpenAI`". Its
    # retries are the SDK's defaults, assumed since nothing here says otherwise.
    origin: str | None = None
    # The key comes from ``client._idempotency_header = ...``: an attribute that
    # with_options()/copy() do not carry over (the SDK's __init__ resets it).
    header_attribute: bool = False
    # The line of the with_options()/copy() that dropped that attribute.
    lost_key_line: int | None = None
    # ``llm._idempotency_header = ...`` on a LangChain wrapper, which never reads it.
    wrapper_header_line: int | None = None

    @property
    def label(self) -> str:
        where = f", line {self.line}" if self.line else ""
        return f"{_LABELS[self.kind]} client `{self.name}`{where}"

    @property
    def sdk_attempts(self) -> int | None:
        return None if self.max_retries is None else self.max_retries + 1

    def describe_retries(self) -> str:
        if self.protected:
            attempts = self.sdk_attempts if self.sdk_attempts is not None else "?"
            return f"payonce protect(), {attempts} keyed attempts per call"
        if self.max_retries is None:
            return "max_retries unknown"
        if self.retries_given:
            return f"max_retries={self.max_retries}"
        what = "num_retries" if self.kind is ClientKind.LITELLM_ROUTER else "max_retries"
        if self.origin is not None:
            return (
                f"{self.origin}, constructed elsewhere: assumed the SDK default"
                f" {what}={self.max_retries}"
            )
        return f"default {what}={self.max_retries}"


def client_kind_of(qualified: str | None) -> ClientKind | None:
    """The client kind of a class's qualified name, or None if it is not an LLM client."""
    if not qualified or "." not in qualified:
        return None
    root = qualified.split(".")[0]
    return _CLIENT_CLASSES.get((root, qualified.rsplit(".", 1)[1]))


def client_from_call(call: ast.Call, names: ModuleNames, name: str) -> ClientInfo | None:
    """The client a constructor call builds, or None if ``call`` builds no LLM client."""
    kind = client_kind_of(names.qualify(call.func))
    if kind is None:
        return None
    retries_keyword = "num_retries" if kind is ClientKind.LITELLM_ROUTER else "max_retries"
    given = _keyword(call, retries_keyword)
    if given is None:
        # The Router's default has changed between LiteLLM releases: do not guess.
        retries = None if kind is ClientKind.LITELLM_ROUTER else SDK_DEFAULT_RETRIES
        if _has_double_star(call):
            retries = None
    else:
        retries = names.integer(given)
    headers = _keyword(call, "default_headers")
    http_client = _keyword(call, "http_client")
    return ClientInfo(
        kind=kind,
        name=name,
        line=call.lineno,
        max_retries=retries,
        retries_given=given is not None,
        # An IdempotentTransport underneath sends one key per SDK call.
        sends_sdk_key=http_client is not None and _uses_payonce_transport(http_client, names),
        default_key=headers is not None and has_key_header(headers, names) is not False,
    )


def client_from_annotation(argument: ast.arg, names: ModuleNames) -> ClientInfo | None:
    """The client a parameter's annotation declares: ``client: openai.AsyncOpenAI | None``.

    It was constructed elsewhere, so its retries are the SDK's default.
    """
    if argument.annotation is None:
        return None
    kind = _annotated_kind(argument.annotation, names, depth=0)
    if kind is None:
        return None
    return ClientInfo(
        kind=kind,
        name=argument.arg,
        line=argument.lineno,
        # The Router's default has changed between LiteLLM releases: do not guess.
        max_retries=None if kind is ClientKind.LITELLM_ROUTER else SDK_DEFAULT_RETRIES,
        retries_given=False,
        origin=f"parameter `{argument.arg}: {ast.unparse(argument.annotation)}`",
    )


_OPTIONAL_FORMS = frozenset({"Optional", "Union"})


def _annotated_kind(node: ast.expr, names: ModuleNames, depth: int) -> ClientKind | None:
    """The client kind an annotation names; None unless every non-None member is one kind."""
    if depth > 8:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:  # "openai.OpenAI", "Optional[AsyncOpenAI]": forward references
            parsed = ast.parse(node.value.strip(), mode="eval").body
        except SyntaxError:
            return None
        return _annotated_kind(parsed, names, depth + 1)
    members: list[ast.expr]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        members = [node.left, node.right]
    elif isinstance(node, ast.Subscript):
        form = (names.qualify(node.value) or "").rsplit(".", 1)[-1]
        elements = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if form == "Annotated":
            members = elements[:1]
        elif form in _OPTIONAL_FORMS:
            members = elements
        else:
            return None  # type[OpenAI], list[OpenAI]: not a client instance
    else:
        return client_kind_of(names.qualify(node))
    kinds = {
        _annotated_kind(member, names, depth + 1)
        for member in members
        if not (isinstance(member, ast.Constant) and member.value is None)
    }
    return kinds.pop() if len(kinds) == 1 else None


def protected_client(base: ClientInfo, call: ast.Call, names: ModuleNames) -> ClientInfo:
    """``payonce.client.protect(client, policy=RetryPolicy(attempts=N))``."""
    attempts: int | None = 3  # RetryPolicy's default
    policy = _keyword(call, "policy")
    if policy is not None:
        given = _keyword(policy, "attempts") if isinstance(policy, ast.Call) else None
        attempts = (
            names.integer(given)
            if given is not None
            else (3 if isinstance(policy, ast.Call) else None)
        )
    return replace(
        base,
        max_retries=None if attempts is None else attempts - 1,
        retries_given=True,
        sends_sdk_key=True,
        protected=True,
    )


def _uses_payonce_transport(node: ast.expr, names: ModuleNames) -> bool:
    return any(
        isinstance(inner, ast.Call)
        and (names.qualify(inner.func) or "").startswith("payonce.client")
        and (names.qualify(inner.func) or "").endswith("IdempotentTransport")
        for inner in ast.walk(node)
    )


def derive_client(base: ClientInfo, call: ast.Call, names: ModuleNames) -> ClientInfo:
    """``client.with_options(max_retries=0)``, ``llm.with_retry(...)`` and similar copies."""
    method = call.func.attr if isinstance(call.func, ast.Attribute) else ""
    if method in {"with_options", "copy"}:
        copied = base
        if base.header_attribute:
            # A new client: its __init__ sets _idempotency_header = None. The
            # http_client (protect(), IdempotentTransport) is handed over and survives.
            copied = replace(
                base, sends_sdk_key=False, header_attribute=False, lost_key_line=call.lineno
            )
        given = _keyword(call, "max_retries")
        if given is not None:
            return replace(copied, max_retries=names.integer(given), retries_given=True)
        return copied
    if method == "with_retry":
        attempts_node = _keyword(call, "stop_after_attempt")
        # LangChain's Runnable.with_retry defaults to stop_after_attempt=3.
        attempts = 3 if attempts_node is None else names.integer(attempts_node)
        return replace(base, wrapper_retries=(*base.wrapper_retries, (attempts, call.lineno)))
    return base


_DERIVING_METHODS = frozenset(
    {
        "with_options",
        "copy",
        "with_retry",
        "with_structured_output",
        "bind_tools",
        "bind",
        "with_config",
        "with_fallbacks",
    }
)


def is_deriving_call(call: ast.Call) -> bool:
    """Whether ``call`` is a method returning a configured copy of its receiver."""
    return isinstance(call.func, ast.Attribute) and call.func.attr in _DERIVING_METHODS


def has_key_header(headers: ast.expr, names: ModuleNames) -> bool | None:
    """Whether a headers mapping names an idempotency key: True, False, or None (cannot tell)."""
    if isinstance(headers, ast.Dict):
        unknown = False
        for key in headers.keys:
            if key is None:  # {**other}: may carry the key
                unknown = True
                continue
            text = names.string(key)
            if text is None:
                unknown = True
            elif text.lower() in IDEMPOTENCY_HEADERS:
                return True
        return None if unknown else False
    if isinstance(headers, ast.Call) and dotted(headers.func) == "dict":
        if any(keyword.arg is None for keyword in headers.keywords) or headers.args:
            return None
        return any(
            (keyword.arg or "").lower().replace("_", "-") in IDEMPOTENCY_HEADERS
            for keyword in headers.keywords
        )
    return None


def key_value(headers: ast.expr, names: ModuleNames) -> ast.expr | None:
    """The expression given as the idempotency key inside a headers dict literal."""
    if isinstance(headers, ast.Dict):
        for key, value in zip(headers.keys, headers.values, strict=True):
            text = names.string(key) if key is not None else None
            if text is not None and text.lower() in IDEMPOTENCY_HEADERS:
                return value
    return None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return None


def _has_double_star(call: ast.Call) -> bool:
    return any(keyword.arg is None for keyword in call.keywords)


# ``/v1/messages`` only right after the base URL: Lark's ``/open-apis/im/v1/messages``
# and WhatsApp's ``/{phone_id}/messages`` are chat APIs, not Anthropic's.
LLM_PATH = re.compile(
    r"/(?:v1/)?(?:chat/completions|completions|responses)\b|(?:^|://[^/]+|\})/v1/messages\b"
)
LLM_HOST = re.compile(
    r"(?:api\.openai\.com|openai\.azure\.com|api\.anthropic\.com|generativelanguage\.googleapis"
    r"|api\.mistral\.ai|api\.groq\.com|api\.together\.xyz|api\.deepseek\.com|openrouter\.ai)",
    re.IGNORECASE,
)


def looks_like_llm_url(text: str) -> bool:
    """Whether a URL (or URL template) points at an LLM generation endpoint or host."""
    return bool(LLM_PATH.search(text) or LLM_HOST.search(text))
