"""The demo's application: an LLM call in a retry loop, as the incident's team wrote it.

``ask()`` is deliberately the code the incident report describes: the official SDK with
its default retries, inside an application loop that retries once after a
timeout. With ``use_key`` it sends one ``Idempotency-Key`` per business request
(what payonce needs); without it, it is run A's path, and ``payonce lint``
flags it (PO101, PO201, PO202, PO401; ``tests/demo`` checks that).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import openai

__all__ = ["Outcome", "ScaledAsyncOpenAI", "ask"]


class ScaledAsyncOpenAI(openai.AsyncOpenAI):
    """The official async SDK whose own retry backoff is scaled like every other duration.

    The SDK waits ``min(0.5 * 2**n, 8)`` seconds less up to 25% jitter between
    its retries; at ``--time-scale 0.1`` the demo's latencies and timeouts are a
    tenth of the incident's, so its backoff must be too, or it would dominate.
    """

    time_scale: float = 1.0

    def _calculate_retry_timeout(self, *args: Any, **kwargs: Any) -> float:
        return float(super()._calculate_retry_timeout(*args, **kwargs)) * self.time_scale


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the user behind one business request saw."""

    business_id: str
    ok: bool
    latency: float  # seconds, from the first attempt to the answer or the last error
    request_id: str | None  # the provider's id of the answer received, if any
    status: int  # 200, the last error's status, or 0 when no answer came back


async def ask(
    client: openai.AsyncOpenAI,
    prompt: str,
    business_id: str,
    use_key: bool,
    *,
    timeout: float,
    app_attempts: int,
    app_backoff: float,
) -> Outcome:
    """One business request: the SDK call, retried by the application after a timeout."""
    headers: dict[str, str] = {}
    if use_key:
        headers["Idempotency-Key"] = f"demo-{business_id}"
    started = time.perf_counter()
    status = 0
    for attempt in range(app_attempts):
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model="gpt-4o",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=256,
                user=business_id,  # the provider's bill line names it (the ledger's "user")
                extra_headers=headers,
                timeout=timeout,
            )
            raw.parse()
            elapsed = time.perf_counter() - started
            return Outcome(business_id, True, elapsed, raw.headers.get("x-request-id"), 200)
        except openai.APITimeoutError:
            status = 0
            if attempt + 1 < app_attempts:
                await asyncio.sleep(app_backoff)
        except openai.APIStatusError as exc:
            status = exc.status_code
            break
        except openai.APIConnectionError:
            status = 0
            break
    return Outcome(business_id, False, time.perf_counter() - started, None, status)
