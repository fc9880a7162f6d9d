"""One soak's processes and its end-of-run checks.

A stack is a ``payonce sim`` with latency and random faults, and two gateways
sharing one store, as replicas behind a load balancer: the *steady* one runs the
whole time (its RSS is what the soak measures), the *restarted* one gets a
SIGTERM halfway and is started again on the same port. Every attempt of the
traffic goes to either at random, so retries also cross replicas.

Warm caches are excluded from the RSS check by bounding them small enough to be
full before minute 1, where the baseline is taken: ``--replay-cache 256KiB``
holds about 60 answers (each is charged at least 1,280 bytes plus its body and
headers, ~4 KiB here) and the steady gateway completes more than that in its
first 20 seconds; the credential map holds the four tenants the traffic uses;
SQLite's page cache is bounded by its default ``cache_size`` (2 MiB) and
redis-py's connection pool by the gateway's concurrency.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx2 as httpx
import redis

from tests.soak.traffic import Op, Traffic
from tests.support.processes import Process, start_payonce

SIM_FLAGS = [
    "--latency",
    "lognormal:p50=80ms,p99=600ms",
    "--token-rate",
    "200/s",
    "--fail",
    "500:0.03,429:0.01,503:0.01",
]
GATEWAY_FLAGS = ["--lease", "6s", "--wait-timeout", "15s", "--replay-cache", "256KiB"]
RSS_EVERY = 2.0


def rss_kib(pid: int) -> int:
    """The resident set size of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


@dataclass
class Stack:
    """The processes of one soak (one store) and what they left behind."""

    name: str
    store: str
    directory: Path
    sim: Process
    steady: Process
    restarted: Process
    logs: list[Path] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)  # (seconds in, KiB)
    restart_seconds: float = 0.0
    restart_code: int | None = None

    @classmethod
    def start(cls, name: str, store: str, directory: Path, seed: int) -> Stack:
        sim = start_payonce(
            ["sim", *SIM_FLAGS, "--seed", str(seed)],
            log_dir=directory,
            ready_path="/_sim/health",
        )
        gateways = []
        try:
            for role in ("steady", "restarted"):
                log_dir = directory / f"{role}-1"
                log_dir.mkdir()
                gateways.append(
                    start_payonce(
                        cls._serve_args(sim, store, log_dir),
                        log_dir=log_dir,
                        ready_path="/_payonce/health",
                    )
                )
        except BaseException:
            for process in [*gateways, sim]:
                process.stop()
            raise
        stack = cls(name, store, directory, sim, *gateways)
        stack.logs = [sim.log, *(g.log for g in gateways)]
        return stack

    @staticmethod
    def _serve_args(sim: Process, store: str, log_dir: Path) -> list[str]:
        call_log = str(log_dir / "calls.jsonl")
        args = ["serve", "--upstream", sim.url, "--store", store, "--call-log", call_log]
        return [*args, *GATEWAY_FLAGS]

    def stop(self) -> None:
        for process in (self.steady, self.restarted, self.sim):
            process.stop()

    async def drive(self, traffic: Traffic, seconds: float, rate: float) -> None:
        """Run the traffic, restart one gateway halfway and sample the other's RSS."""
        start = time.monotonic()

        async def sample() -> None:
            while True:
                self.rss.append((time.monotonic() - start, rss_kib(self.steady.popen.pid)))
                await asyncio.sleep(RSS_EVERY)

        sampler = asyncio.create_task(sample())
        restart = asyncio.create_task(self._restart_at(traffic, start + seconds / 2))
        try:
            await traffic.run(seconds, rate)
            await restart
        finally:
            sampler.cancel()
            restart.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        self.rss.append((time.monotonic() - start, rss_kib(self.steady.popen.pid)))

    async def _restart_at(self, traffic: Traffic, when: float) -> None:
        await asyncio.sleep(max(0.0, when - time.monotonic()))
        old = self.restarted
        port = int(old.url.rsplit(":", 1)[1])
        traffic.start_in_flight(old.url)
        await asyncio.sleep(0.4)  # they have reached the upstream
        traffic.restarting = old.url
        began = time.monotonic()
        old.popen.send_signal(signal.SIGTERM)
        self.restart_code = await asyncio.to_thread(old.popen.wait, 60)
        log_dir = self.directory / "restarted-2"
        log_dir.mkdir()
        self.restarted = await asyncio.to_thread(
            start_payonce,
            self._serve_args(self.sim, self.store, log_dir),
            log_dir=log_dir,
            ready_path="/_payonce/health",
            port=port,
        )
        self.logs.append(self.restarted.log)
        self.restart_seconds = time.monotonic() - began
        traffic.restart_window = (began, time.monotonic())
        traffic.restarting = None

    # -- what is checked at the end ---------------------------------------------

    def ledger_by_user(self, settle: float = 3.0, limit: float = 30.0) -> Counter[str]:
        """Billed generations per ``user`` once the ledger stopped growing for ``settle`` s."""
        deadline = time.monotonic() + limit
        last, stable_since = -1, time.monotonic()
        while True:
            ledger = httpx.get(self.sim.url + "/_sim/ledger", timeout=30).json()
            if ledger["billed"] != last:
                last, stable_since = ledger["billed"], time.monotonic()
            elif time.monotonic() - stable_since >= settle or time.monotonic() > deadline:
                return Counter(str(entry["user"]) for entry in ledger["entries"])
            time.sleep(0.5)

    def records_in_progress(self) -> list[str]:
        """Names of the store's records still ``in_progress`` (read from the store itself)."""
        if self.store.startswith("sqlite:///"):
            path = self.store.removeprefix("sqlite:///")
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                rows = db.execute(
                    "SELECT tenant, key FROM payonce_records WHERE state = 'in_progress'"
                ).fetchall()
            return [f"{tenant}:{key}" for tenant, key in rows]
        client = redis.Redis.from_url(self.store)
        try:
            return [
                name.decode()
                for name in client.scan_iter(match="payonce:*:r", count=1000)
                if client.hget(name, "state") == b"in_progress"
            ]
        finally:
            client.close()

    def tracebacks(self) -> list[str]:
        found = []
        for log in self.logs:
            text = log.read_text(errors="replace")
            if "Traceback" in text or "exception was never retrieved" in text:
                found.append(f"{log}:\n{text[text.find('Traceback') - 500 :][:4000]}")
        return found

    def rss_growth(self) -> tuple[int, int]:
        """RSS (KiB) at minute 1 and at the end."""
        at_minute = min(self.rss, key=lambda sample: abs(sample[0] - 60.0))
        return at_minute[1], self.rss[-1][1]


def bill_report(ops: list[Op], billed: Counter[str]) -> tuple[list[str], list[str]]:
    """Compare each operation's bills with its expected range: (defects, summary lines)."""
    defects = []
    known = {op.id for op in ops}
    for user, count in billed.items():
        if user not in known:
            defects.append(f"{count} billed generation(s) of no operation (user {user!r})")
    reasons: Counter[str] = Counter()
    ranged: Counter[str] = Counter()
    for op in ops:
        got = billed.get(op.id, 0)
        if not op.low <= got <= op.high:
            outcomes = [a.outcome for a in op.attempts][:12]
            defects.append(
                f"{op.id} (key {op.key}): billed {got}, expected {op.low}..{op.high}"
                f" ({dict(op.reasons)}; attempts {outcomes})"
            )
        for reason, count in op.reasons.items():
            reasons[reason] += count
        if op.low != op.high:
            ranged["billed"] += got
            ranged["ops"] += 1
    total = sum(billed.values())
    lines = [f"ledger: {total} billed generations for {len(ops)} operations"]
    lines += [f"  {count:6d}  {reason}" for reason, count in sorted(reasons.items())]
    lines.append(
        f"  ranged (0 or 1 each): {ranged['billed']} billed of {ranged['ops']} such operations"
    )
    return defects, lines
