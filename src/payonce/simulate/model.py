"""The vectorised Monte Carlo: every business request of a run at once, one array each.

Time is per business request, in seconds from its start. The application loop
and the SDK advance all active requests one attempt per step (a request sends at
most ``app_attempts * (sdk_retries + 1)`` attempts, so there are at most that many
steps); each step keeps only the requests still going, so later steps are cheap.

One attempt travels down a chain of layers. A layer is a function
``(requests, arrive, give_up) -> (answer, ok)``: for the requests (indices) that
reach it at times ``arrive``, whose caller stops waiting at ``give_up``, the time
the layer answers and whether the answer is a success. ``answer`` may be later
than ``give_up`` (nobody reads it then) or ``inf`` (the layer never answers,
because its caller left first). Layers bill by adding to the run's ``billed``::

    provider   answers at arrive + L (billed) or, at rate failure_rate, a 5xx at once
    proxy      tries the layer below up to retries + 1 times, each cut at its timeout
    gateway    payonce: the first arrival of a key claims it and calls the layer
               below; the others join the running call or get its stored answer

The semantics are docs/simulate.md's, which ``payonce demo`` measures with real
processes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from payonce.simulate.config import Backoff, ProxyConfig, RetryOn, StackConfig

__all__ = ["Outcome", "simulate"]

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
Layer = Callable[[Ints, Floats, Floats], tuple[Floats, Bools]]

_SUCCESS, _TIMEOUT, _SERVER_ERROR = 0, 1, 2
# Float noise when a request's clock meets its deadline (t + (deadline - t)).
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to each business request of one run (arrays of ``requests`` items).

    ``billed``: generations the provider billed for it; ``attempts``: SDK attempts
    sent; ``success``: the application got an answer; ``latency``: seconds until the
    application returned, with the answer or with its last error.
    """

    billed: Ints
    attempts: Ints
    success: Bools
    latency: Floats

    @property
    def requests(self) -> int:
        return int(self.billed.size)


def simulate(stack: StackConfig, requests: int, *, seed: int | None = None) -> Outcome:
    """Run ``requests`` business requests through ``stack``; ``seed`` makes it repeatable."""
    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    return _Run(stack, requests, np.random.default_rng(seed)).run()


class _Run:
    """The state of one Monte Carlo run: per-request arrays and the chain of layers."""

    def __init__(self, stack: StackConfig, requests: int, rng: np.random.Generator) -> None:
        self.stack = stack
        self.rng = rng
        self.billed = np.zeros(requests, dtype=np.int64)
        # payonce's record per key: when its run answers (nan: no record) and how.
        self.record_answer = np.full(requests, np.nan)
        self.record_ok = np.zeros(requests, dtype=np.bool_)
        self.top = self._chain()

    def _chain(self) -> Layer:
        stack, proxy = self.stack, self.stack.proxy
        if not stack.payonce:
            return self._proxy(self._provider, proxy) if proxy else self._provider
        upstream: Layer = self._provider
        if proxy and stack.proxy_below_payonce:
            upstream = self._proxy(self._provider, proxy)
        gateway = self._gateway(upstream)
        if proxy and not stack.proxy_below_payonce:
            return self._proxy(gateway, proxy)
        return gateway

    # -- the layers --------------------------------------------------------------

    def _provider(self, requests: Ints, arrive: Floats, give_up: Floats) -> tuple[Floats, Bools]:
        # Every generation started runs to its end and is billed, whoever still waits
        # (docs/sim.md, billing ledger); a fault is refused before any work and not billed.
        ok = np.ones(requests.size, dtype=np.bool_)
        if self.stack.failure_rate > 0:
            ok = self.rng.random(requests.size) >= self.stack.failure_rate
        latency = self.stack.latency.sample(self.rng, requests.size)
        self.billed[requests] += ok  # indices are unique within one call
        return np.where(ok, arrive + latency, arrive), ok

    def _proxy(self, below: Layer, proxy: ProxyConfig) -> Layer:
        def call(requests: Ints, arrive: Floats, give_up: Floats) -> tuple[Floats, Bools]:
            answer = np.full(requests.size, np.inf)
            ok = np.zeros(requests.size, dtype=np.bool_)
            start = arrive.copy()
            pending = np.arange(requests.size)
            for attempt in range(proxy.retries + 1):
                # nginx aborts a request whose client has closed the connection, so it
                # starts no further try for it; those answers stay inf (never sent).
                pending = pending[start[pending] < give_up[pending]]
                if pending.size == 0:
                    break
                cut = start[pending] + proxy.timeout
                reply, reply_ok = below(requests[pending], start[pending], cut)
                answered = reply <= cut
                more = attempt < proxy.retries
                again_5xx = answered & ~reply_ok & (more and proxy.retry_on.server_errors)
                final = answered & ~again_5xx
                answer[pending[final]] = reply[final]
                ok[pending[final]] = reply_ok[final]
                timed_out = ~answered
                if more and proxy.retry_on.timeouts:
                    again_timeout = timed_out
                else:
                    # The last try timed out: 504 Gateway Timeout, at once.
                    answer[pending[timed_out]] = cut[timed_out]
                    again_timeout = np.zeros_like(timed_out)
                start[pending[again_5xx]] = reply[again_5xx]
                start[pending[again_timeout]] = cut[again_timeout]
                pending = pending[again_5xx | again_timeout]
            return answer, ok

        return call

    def _gateway(self, upstream: Layer) -> Layer:
        def call(requests: Ints, arrive: Floats, give_up: Floats) -> tuple[Floats, Bools]:
            recorded = self.record_answer[requests]
            recorded_ok = self.record_ok[requests]
            exists = ~np.isnan(recorded)
            # 408/409/429/5xx release the key when they come back (docs/gateway.md, "The contract"):
            # an arrival after that claims it again; one before gets that answer too.
            released = exists & ~recorded_ok & (arrive >= recorded)
            joins = exists & ~released
            answer = np.where(joins, np.maximum(arrive, recorded), np.inf)
            ok = joins & recorded_ok
            claims = ~joins
            if claims.any():
                claimed = requests[claims]
                # A keyed upstream call outlives its client: nobody gives up on it.
                reply, reply_ok = upstream(claimed, arrive[claims], np.full(claimed.size, np.inf))
                self.record_answer[claimed] = reply
                self.record_ok[claimed] = reply_ok
                answer[claims] = reply
                ok[claims] = reply_ok
            return answer, ok

        return call

    # -- the SDK and the application loop ----------------------------------------

    def run(self) -> Outcome:
        stack = self.stack
        size = self.billed.size
        clock = np.zeros(size)
        attempts = np.zeros(size, dtype=np.int64)
        success = np.zeros(size, dtype=np.bool_)
        latency = np.zeros(size)
        sdk_retry = np.zeros(size, dtype=np.int64)  # retries made in the current SDK call
        app_retry = np.zeros(size, dtype=np.int64)
        deadline = np.inf if stack.deadline is None else stack.deadline
        active = np.arange(size, dtype=np.int64)
        for _ in range(stack.max_attempts):
            if active.size == 0:
                break
            now = clock[active]
            attempts[active] += 1
            kind, took = self._attempt(active, now, np.minimum(stack.timeout, deadline - now))
            now = now + took
            clock[active] = now
            done = kind == _SUCCESS
            success[active[done]] = True
            out_of_time = now >= deadline - _EPSILON
            by_sdk = (
                ~done & (sdk_retry[active] < stack.sdk_retries) & _covers(stack.sdk_retry_on, kind)
            )
            by_app = (
                ~done
                & ~by_sdk
                & (app_retry[active] < stack.app_attempts - 1)
                & _covers(stack.app_retry_on, kind)
            )
            wait = np.zeros(active.size)
            wait[by_sdk] = self._backoff(stack.sdk_backoff, sdk_retry[active[by_sdk]])
            wait[by_app] = self._backoff(stack.app_backoff, app_retry[active[by_app]])
            sdk_retry[active[by_sdk]] += 1
            app_retry[active[by_app]] += 1
            sdk_retry[active[by_app]] = 0
            retry = (by_sdk | by_app) & ~out_of_time
            # An overall deadline (asyncio.timeout around the business call) ends the
            # request when it comes, in the middle of a backoff too.
            clock[active[retry]] = np.minimum(now[retry] + wait[retry], deadline)
            retry &= clock[active] < deadline - _EPSILON
            ended = ~retry
            latency[active[ended]] = clock[active[ended]]
            active = active[retry]
        return Outcome(billed=self.billed, attempts=attempts, success=success, latency=latency)

    def _attempt(self, requests: Ints, now: Floats, window: Floats) -> tuple[Ints, Floats]:
        """One SDK attempt per request: its result kind and how long it took."""
        stack = self.stack
        kind = np.full(requests.size, _TIMEOUT, dtype=np.int64)
        took = window.copy()
        connects = np.ones(requests.size, dtype=np.bool_)
        if stack.connect_failure_rate > 0:
            # The connection hangs until the connect timeout: nothing reached anyone.
            connects = self.rng.random(requests.size) >= stack.connect_failure_rate
            took[~connects] = np.minimum(stack.connect_timeout, window[~connects])
        give_up = now[connects] + window[connects]
        answer, ok = self.top(requests[connects], now[connects], give_up)
        heard = answer <= give_up
        kind[connects] = np.where(heard, np.where(ok, _SUCCESS, _SERVER_ERROR), _TIMEOUT)
        took[connects] = np.where(heard, answer - now[connects], window[connects])
        return kind, took

    def _backoff(self, backoff: Backoff, retry: Ints) -> Floats:
        ceiling = np.minimum(
            backoff.initial * backoff.multiplier ** retry.astype(np.float64), backoff.maximum
        )
        if backoff.jitter == 0:
            return ceiling
        return ceiling * (1.0 - backoff.jitter * self.rng.random(retry.size))


def _covers(retry_on: RetryOn, kind: Ints) -> Bools:
    covered = np.zeros(kind.size, dtype=np.bool_)
    if retry_on.timeouts:
        covered |= kind == _TIMEOUT
    if retry_on.server_errors:
        covered |= kind == _SERVER_ERROR
    return covered
