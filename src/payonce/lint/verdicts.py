"""The verdicts on one LLM call site: PO101, PO102, PO201, PO202, PO203.

The analyzer finds the call, its client, its key and the retry layers around
it; this module turns them into findings and does the stack arithmetic
(``3 x 5 = 15``, ``? x 2 = at least 6`` when a factor is not readable).
"""

from __future__ import annotations

from payonce.lint.calls import KeyState, LlmCall
from payonce.lint.retries import RetryLayer
from payonce.lint.sdk import ClientInfo, ClientKind
from payonce.lint.stacks import describe_stack

__all__ = ["judge_call"]


def judge_call(
    llm: LlmCall, layers: tuple[RetryLayer, ...], *, fresh_key: bool
) -> list[tuple[str, str]]:
    """``(code, message)`` for each of PO101, PO102, PO201, PO202, PO203 a call breaks.

    ``layers`` are the application retry layers around the call, outermost
    first; ``fresh_key`` says its idempotency key is generated inside them.
    """
    verdicts: list[tuple[str, str]] = []

    def add(code: str, message: str) -> None:
        verdicts.append((code, message))

    client = llm.client
    if client is not None and client.wrapper_retries:
        wrappers = tuple(
            RetryLayer("LangChain .with_retry()", line, attempts, "attempts not a literal", -1)
            for attempts, line in client.wrapper_retries
        )
        layers = (*layers, *wrappers)
    unknown_client = client is not None and client.kind is ClientKind.UNKNOWN
    sdk_retries = llm.sdk_attempts is None or llm.sdk_attempts > 1
    if layers and sdk_retries and not unknown_client:
        add(
            "PO101",
            f"{llm.label} ({llm.sdk_detail}) is retried by {describe_stack(layers)}:"
            f" {_billed([llm.sdk_attempts, *_attempts(layers)], llm.sdk_floor)} billed calls"
            f" per logical call at worst; {_sdk_fix(llm)} and keep one retry layer",
        )
    if len(layers) >= 2:
        add(
            "PO102",
            f"{len(layers)} application retry layers around {llm.what}:"
            f" {describe_stack(layers)}: {_billed(_attempts(layers))} attempts; keep one",
        )
    if layers and llm.unkeyed:
        why = (
            "; the client's own key (_idempotency_header or protect()) is minted per SDK"
            " call, so it is new on every application attempt"
            if llm.sends_sdk_key
            else ""
        )
        partial = llm.key is KeyState.PARTIAL
        where = (" on that path" if llm.key_missing else " on those paths") if partial else ""
        add(
            "PO201",
            f"{llm.what} is retried by {describe_stack(layers)} without an idempotency"
            f" key{llm.key_gap}{why}: every attempt{where} is"
            ' billed again; pass extra_headers={"Idempotency-Key": key} with a key made once'
            f" per request, outside the retry{', on every path' if partial else ''}",
        )
    if layers and llm.key is KeyState.EXPLICIT and fresh_key:
        add(
            "PO203",
            f"the idempotency key of {llm.what} is generated inside the retried code"
            f" ({describe_stack(layers)}): each attempt sends a new key, so nothing is"
            " replayed; generate it once per business request, outside the retry",
        )
    if (
        llm.sdk_attempts is not None
        and llm.sdk_attempts > 1
        and client is not None
        and not unknown_client
        and llm.unkeyed
        and not llm.sends_sdk_key
    ):
        add(
            "PO202",
            f"{llm.what} through {client.label} ({client.describe_retries()}) re-sends"
            f" up to {llm.sdk_attempts} times without an idempotency key{llm.key_gap}"
            f"{_why_no_key(client)}: {_sdk_key_fix(client)}",
        )
    if client is None and llm.what.startswith("litellm.") and llm.unkeyed:
        attempts = llm.sdk_attempts
        if (attempts or llm.sdk_floor) > 1:
            count = str(attempts) if attempts is not None else f"at least {llm.sdk_floor}"
            add(
                "PO202",
                f"{llm.what} ({llm.sdk_detail}) sends each call up to {count} times without"
                f" an idempotency key{llm.key_gap}: every retry LiteLLM or the provider SDK"
                " makes is a new generation, billed again; pass"
                ' extra_headers={"Idempotency-Key": key} with a key made once per request'
                " (LiteLLM re-sends it on its retries), or num_retries=0 and max_retries=0",
            )
    return verdicts


def _why_no_key(client: ClientInfo) -> str:
    if client.lost_key_line is not None:
        return (
            f" (the _idempotency_header set on it is dropped by with_options()/copy() on"
            f" line {client.lost_key_line}: the copy is a new client, whose __init__ resets it)"
        )
    if client.wrapper_header_line is not None:
        return (
            f" (`{client.name}._idempotency_header` on line {client.wrapper_header_line} sets"
            " an attribute the LangChain wrapper never reads)"
        )
    return ""


def _sdk_key_fix(client: ClientInfo) -> str:
    if client.kind is ClientKind.LANGCHAIN:
        return (
            "its calls go through the SDK client it builds, so set"
            f' `{client.name}.root_client._idempotency_header = "Idempotency-Key"` (and'
            " root_async_client's), pass http_client=/http_async_client= built on payonce's"
            " IdempotentTransport, run the app under `payonce run` (or `import payonce.auto`),"
            " or max_retries=0"
        )
    return (
        'set client._idempotency_header = "Idempotency-Key" behind payonce (on every'
        " with_options()/copy() too, which drop it), run the app under `payonce run` (or"
        " `import payonce.auto`), wrap the client in protect(), or max_retries=0"
    )


def _attempts(layers: tuple[RetryLayer, ...]) -> list[int | None]:
    return [layer.attempts for layer in layers]


def _sdk_fix(llm: LlmCall) -> str:
    if llm.client is None and llm.what.startswith("litellm."):
        return "pass max_retries=0 and num_retries=0"
    if llm.client is not None and llm.client.origin is not None:
        # Built in another module: the fix may not be reachable from here.
        return (
            "construct it with max_retries=0 where it is built (or call it through"
            f" `{llm.client.name}.with_options(max_retries=0)`)"
        )
    return "construct it with max_retries=0"


def _billed(factors: list[int | None], floor: int = 1) -> str:
    """``3 x 5 = 15``, or ``3 x ? = at least 3 (some factors unknown)``.

    ``floor`` is what is known of the first factor when it is unknown.
    """
    known = floor if factors and factors[0] is None else 1
    for factor in factors:
        if factor is not None:
            known *= factor
    shown = " x ".join(str(factor) if factor is not None else "?" for factor in factors)
    if any(factor is None for factor in factors):
        return f"{shown} = at least {known} (some factors unknown)"
    return f"{shown} = {known}" if len(factors) > 1 else str(known)
