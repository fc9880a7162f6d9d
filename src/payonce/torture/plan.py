"""A seeded schedule of client calls and faults: what one torture run does, and when.

Everything a run does is drawn here, from one ``random.Random(seed)``, before it
starts: the same seed gives the same schedule, so a failing run is replayed with
``payonce torture --seed N`` (timing still varies: processes are real). A schedule
is plain data, so shrinking drops calls and faults from it and runs it again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

__all__ = ["Call", "Fault", "Plan", "generate"]

# Prompts the calls draw from: short ones, so an answer is 16-40 tokens.
PROMPTS = (
    "Say hello to the torture test.",
    "Write one sentence about idempotency keys and retries.",
    "Name three fruits and a vegetable, then count them aloud.",
)
# Upstream shapes (payonce sim --wire) a call may be answered in.
WIRES = (
    "openai",
    "openai",
    "openrouter",
    "sse-starlette",
    "tgi",
    "openai,crlf",
    "openai,no-final-blank",
    "openai,close-delimited",
    "anthropic",
)


@dataclass(frozen=True, slots=True)
class Call:
    """One client request.

    ``key`` is ``None`` for an unkeyed call. All calls of one key send the same
    body (``api``, ``stream``, ``prompt``, ``inputs``), except a ``mismatch``,
    which changes the prompt and must be refused. ``api`` is ``chat``,
    ``messages`` or ``embeddings`` (always whole: ``inputs`` base64 vectors of
    8 KiB each, a large whole answer). ``retry`` is the attempt's number as the
    Stainless SDKs count it in ``x-stainless-retry-count`` (0: a first attempt).
    ``leave_after`` is how many events (streams) the client reads before it
    hangs up, or, for whole answers, seconds it waits (``None``: it reads to the
    end). ``resume`` sends the last event id the
    client of ``resume_of`` received, as a reconnecting SSE client does.
    The upstream side: ``die_after`` events (the provider crashes), ``fail`` an
    error status before any work, ``delay_ms`` to the first token, ``token_ms``
    between tokens, ``wire`` the profile (:mod:`payonce.sim.profiles`).
    """

    number: int
    at: float  # seconds after the run starts
    gateway: int
    key: str | None
    api: str = "chat"  # or "messages", "embeddings"
    stream: bool = False
    prompt: int = 0
    mismatch: bool = False
    leave_after: float | None = None
    resume_of: int | None = None
    die_after: int | None = None
    fail: int | None = None
    delay_ms: int = 0
    token_ms: int = 0
    wire: str = "openai"
    inputs: int = 0
    retry: int = 0


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault the nemesis injects at ``at`` seconds for ``seconds``.

    ``kill`` (SIGKILL, restarted after ``seconds``), ``stop`` (SIGSTOP, SIGCONT
    after ``seconds``) and ``term`` (SIGTERM, restarted after ``seconds``) act on
    gateway ``target``; ``stall`` holds the store still for ``seconds`` (SQLite:
    another process holds its write lock; Redis: SIGSTOP; Redis Cluster: SIGSTOP
    of node ``target``); ``disk`` fills gateway ``target``'s disk for ``seconds``
    (no file it writes may grow: its call log, and SQLite's database when the
    store is SQLite, as on one full disk).
    """

    number: int
    at: float
    kind: str
    seconds: float
    target: int = 0


@dataclass(frozen=True, slots=True)
class Plan:
    """A whole run: its seed, its calls and faults, and how it is set up.

    ``ttl`` is the gateways' ``--ttl`` when the run tries calls that outlive it
    (``None``: the default day).
    """

    seed: int
    store: str
    gateways: int
    lease: float
    calls: tuple[Call, ...]
    faults: tuple[Fault, ...] = field(default=())
    ttl: float | None = None

    @property
    def duration(self) -> float:
        """When the last call or fault starts."""
        times = [call.at for call in self.calls] + [fault.at for fault in self.faults]
        return max(times, default=0.0)

    def without(self, calls: frozenset[int], faults: frozenset[int]) -> Plan:
        """This plan without the numbered calls and faults (a call's resumes go too)."""
        kept = tuple(
            call
            for call in self.calls
            if call.number not in calls and (call.resume_of is None or call.resume_of not in calls)
        )
        return replace(
            self, calls=kept, faults=tuple(f for f in self.faults if f.number not in faults)
        )


def generate(seed: int, *, seconds: float, store: str, gateways: int, lease: float = 1.0) -> Plan:
    """Draw a plan of about ``seconds`` of calls and faults."""
    rng = random.Random(seed)
    calls: list[Call] = []
    number = 0
    at = 0.0
    business = 0
    # One run in four keeps records for seconds only, and some of its calls take
    # longer than that: a record must not expire under a call still running.
    ttl = max(lease, rng.choice((3.0, 4.0))) if rng.random() < 0.25 else None
    delays = (0, 0, 50, 300, 1500) if ttl is None else (0, 50, 300, int(ttl * 1000) + 1500)
    while at < seconds:
        at += rng.expovariate(8.0)  # about 8 business requests a second
        business += 1
        keyed = rng.random() < 0.85
        key = f"t{seed}-{business}" if keyed else None
        kind = rng.random()
        api = "messages" if kind < 0.15 else "embeddings" if kind < 0.2 else "chat"
        stream = api != "embeddings" and rng.random() < 0.6
        wire = rng.choice(WIRES) if stream else "openai"
        if api == "messages" and stream:
            wire = rng.choice(("anthropic", "anthropic,crlf"))
        elif wire.startswith("anthropic"):
            wire = "openai"
        base = Call(
            number=number,
            at=at,
            gateway=rng.randrange(gateways),
            key=key,
            api=api,
            stream=stream,
            prompt=rng.randrange(len(PROMPTS)),
            delay_ms=rng.choice(delays),
            token_ms=rng.choice((0, 5, 20)) if stream else 0,
            wire=wire,
            inputs=rng.randrange(20, 200) if api == "embeddings" else 0,
        )
        upstream = rng.random()
        if upstream < 0.08 and stream:
            base = replace(base, die_after=rng.randrange(1, 12))
        elif upstream < 0.14:
            base = replace(base, fail=rng.choice((429, 500, 503)))
        attempts = 1 if key is None else rng.choice((1, 2, 2, 3, 4))
        when = at
        for attempt in range(attempts):
            call = replace(
                base, number=number, at=when, gateway=rng.randrange(gateways), retry=attempt
            )
            if attempt > 0:
                # A retry: the upstream behaves this time, unless drawn again.
                call = replace(call, die_after=None, fail=None)
            if attempt < attempts - 1 and rng.random() < 0.4:
                leave = rng.randrange(1, 8) if stream else rng.choice((0.05, 0.2, 0.6))
                call = replace(call, leave_after=leave)
            calls.append(call)
            number += 1
            if stream and key is not None and call.leave_after is not None and rng.random() < 0.5:
                resumed = replace(
                    call,
                    number=number,
                    at=when + rng.uniform(0.1, 1.0),
                    gateway=rng.randrange(gateways),
                    leave_after=None,
                    resume_of=call.number,
                    die_after=None,
                    fail=None,
                )
                calls.append(resumed)
                number += 1
            when += rng.choice((0.0, 0.05, 0.3, 1.0, 2.5))
        if key is not None and rng.random() < 0.05:
            calls.append(
                replace(base, number=number, at=when, mismatch=True, die_after=None, fail=None)
            )
            number += 1
    faults = _faults(rng, seconds, store, gateways)
    calls.sort(key=lambda call: call.at)
    return Plan(seed, store, gateways, lease, tuple(calls), faults, ttl)


def _faults(rng: random.Random, seconds: float, store: str, gateways: int) -> tuple[Fault, ...]:
    faults: list[Fault] = []
    at = rng.uniform(0.5, 2.0)
    kinds = ["stall"] if store != "memory" else []
    if gateways > 1:
        kinds += ["kill", "stop", "term"]
    else:
        kinds += ["stop"]
    kinds.append("disk")
    while kinds and at < seconds:
        kind = rng.choice(kinds)
        length = {"kill": 1.5, "term": 1.0, "stop": 2.5, "stall": 2.0, "disk": 4.0}[kind]
        # A stall of Redis Cluster stops one of its three nodes.
        targets = 3 if kind == "stall" and store == "redis-cluster" else gateways
        faults.append(
            Fault(len(faults), at, kind, rng.uniform(0.2, length), rng.randrange(targets))
        )
        at += rng.uniform(2.0, 6.0)
    return tuple(faults)
