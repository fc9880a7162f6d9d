"""Every dashboard query and every alert rule, run by a real Prometheus against known traffic.

A scripted scenario goes through real gateways in front of ``payonce sim``: keyed
first calls on two priced models and one the price table does not know, replays,
joins (concurrent duplicates of a running call), mismatches (422), upstream
failures (500), pass-through calls and SDK retries without a key (unprotected
retries), and keyed requests while the SQLite store is locked (503, store errors).
Prometheus (Debian's package, :mod:`tests.support.prometheus`) scrapes the gateways
every second with ``deploy/prometheus.yml`` and loads ``deploy/prometheus-rules.yml``;
"the day before" is backfilled with ``promtool`` so that the ``offset`` queries and the
rules' baselines have something to compare with. Then every target of every panel of
``deploy/grafana/payonce.json`` (template variables filled as Grafana fills them) and
every alert rule Prometheus loaded is evaluated through ``/api/v1/query`` and checked
against the scenario's truth: what the simulator billed (its ledger), what the script
sent, and the gateways' call logs.

Why the values can be checked exactly, not approximately:

* Every counter the queries read exists at 0 from the gateway's start (the metrics
  pre-create their children) and Prometheus scrapes the gateway at least once
  before any traffic. ``rate()``/``increase()`` then see the whole increase: a
  series whose first sample is already above 0 loses that first value, and
  Prometheus's extrapolation towards the window's start stops at the counter's zero
  point, which for a first sample of 0 is the first sample itself.
* The queries are evaluated at the timestamp of a scrape (``time=`` the last sample),
  so there is nothing to extrapolate at the window's end either: ``increase()`` is
  exactly the counted total and ``rate(x[W])`` exactly total / W. With two replicas
  the targets are scraped at different phases, and at the evaluation time the other
  target's last sample is up to a scrape interval old: Prometheus extrapolates that
  target's increase to the window's end. The test applies the same documented factor
  ((sampled interval + time to the window's end) / sampled interval, from the sample
  timestamps Prometheus returns) to that replica's truth, so the sums stay exact.
* ``$__rate_interval`` is what Grafana computes from the panel's time range and the
  data source's scrape interval (``max($__interval + scrape, 4 * scrape)``); here it
  is set to a window W that covers the whole scenario (whole seconds, longer than the
  test has run), so a rate panel reads the scenario's average rate, known exactly.
  The ``[1d]`` windows of the stats and ``[1h]``/``[5m]`` of the rules cover it too.
* The day before: 11 samples one second apart, all zero then all at yesterday's
  totals, ending a day before Prometheus started. ``offset 1d`` windows of width W
  (and the rules' ``[1d] offset 1h``) contain them whole; those queries are ratios,
  so the extrapolation of yesterday's series (the same for all of them) cancels.

Histograms are checked the way they can be: the quantile a panel shows must lie in
the bucket that holds the true quantile of the latencies in the call logs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import math
import re
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from payonce.observe.metrics import _LATENCY_BUCKETS, _OVERHEAD_BUCKETS
from payonce.observe.pricing import PRICES, USUAL_MODELS, priced_name
from tests.observe.test_dashboard import RULES, load_dashboard, query_panels, variable_query
from tests.support.processes import Process, free_port, start_payonce
from tests.support.prometheus import (
    Prometheus,
    backfill,
    binaries,
    running_prometheus,
    scrape_config,
)
from tests.support.sim import Sim

pytestmark = pytest.mark.prometheus

AUTH = {"Authorization": "Bearer sk-test-prometheus"}
CHEAP, DEAR, UNPRICED = "gpt-4o-mini", "gpt-4o", "mystery-model-7"
PRICED = {CHEAP, DEAR}
# The scenarios the gateways label (--scenarios); the script names these, one it
# does not list (labelled other) and none, in turn.
LISTED = ("invoice-summary", "support-bot")
SCENARIOS = (*LISTED, "made-up-feature", None)
DAY = 86400.0
# The day before: this many seconds of samples, one a second.
YESTERDAY_SECONDS = 10
# How long the in-flight state is held steady: long enough for one scrape of every target.
HOLD_SECONDS = 1.5
REL = 1e-9


# ------------------------------------------------------------------------- the truth


@dataclass
class Truth:
    """What one gateway should have counted (or a weighted sum of several)."""

    requests: Counter[tuple[str, str]] = field(default_factory=Counter)  # (outcome, class)
    upstream: Counter[str] = field(default_factory=Counter)  # status label
    unprotected_retries: float = 0.0
    store_errors: float = 0.0
    unprotected_forwards: float = 0.0
    unknown_cost: float = 0.0
    tokens: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, direction)
    cost: Counter[str] = field(default_factory=Counter)  # model label -> USD
    saved: Counter[str] = field(default_factory=Counter)
    # (seconds, weight) observations of the two histograms
    upstream_latency: list[tuple[float, float]] = field(default_factory=list)
    overhead: list[tuple[float, float]] = field(default_factory=list)
    # (measure, "endpoint" or "scenario", its label) -> count or USD, from the call log:
    # measure is calls, cost, duplicates or unprotected (issue 34's panels).
    where: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    def scaled(self, factor: float) -> Truth:
        """Every count multiplied by ``factor`` (Prometheus's extrapolation of one target)."""

        def times(counter: Counter[Any]) -> Counter[Any]:
            return Counter({name: value * factor for name, value in counter.items()})

        return Truth(
            requests=times(self.requests),
            upstream=times(self.upstream),
            unprotected_retries=self.unprotected_retries * factor,
            store_errors=self.store_errors * factor,
            unprotected_forwards=self.unprotected_forwards * factor,
            unknown_cost=self.unknown_cost * factor,
            tokens=times(self.tokens),
            cost=times(self.cost),
            saved=times(self.saved),
            upstream_latency=[(value, weight * factor) for value, weight in self.upstream_latency],
            overhead=[(value, weight * factor) for value, weight in self.overhead],
            where=times(self.where),
        )

    def __add__(self, other: Truth) -> Truth:
        return Truth(
            requests=self.requests + other.requests,
            upstream=self.upstream + other.upstream,
            unprotected_retries=self.unprotected_retries + other.unprotected_retries,
            store_errors=self.store_errors + other.store_errors,
            unprotected_forwards=self.unprotected_forwards + other.unprotected_forwards,
            unknown_cost=self.unknown_cost + other.unknown_cost,
            tokens=self.tokens + other.tokens,
            cost=self.cost + other.cost,
            saved=self.saved + other.saved,
            upstream_latency=self.upstream_latency + other.upstream_latency,
            overhead=self.overhead + other.overhead,
            where=self.where + other.where,
        )

    def count(self, outcomes: str, status_class: str | None = None) -> float:
        wanted = outcomes.split("|")
        return sum(
            value
            for (outcome, klass), value in self.requests.items()
            if outcome in wanted and (status_class is None or klass == status_class)
        )

    def by_outcome(self) -> dict[str, float]:
        found: Counter[str] = Counter()
        for (outcome, _), value in self.requests.items():
            found[outcome] += value
        return dict(found)

    def by_class(self) -> dict[str, float]:
        found: Counter[str] = Counter()
        for (_, klass), value in self.requests.items():
            found[klass] += value
        return dict(found)

    @property
    def prevented(self) -> dict[str, float]:
        return {kind: self.count(kind) for kind in ("replayed", "joined")}

    @property
    def successes(self) -> float:
        return self.count("forwarded|replayed|joined", "2xx")

    @property
    def spend(self) -> float:
        return sum(self.cost.values())

    # The numbers of docs/observability.md, "The three numbers".
    @property
    def cost_per_success(self) -> float:
        return self.spend / self.successes

    @property
    def duplicate_ratio(self) -> float:
        duplicates = self.count("replayed|joined") + self.unprotected_retries
        return duplicates / self.count("forwarded|replayed|joined|passthrough")

    @property
    def hit_rate(self) -> float:
        return self.count("replayed|joined") / self.count("forwarded|replayed|joined")

    @property
    def billed_duplicates(self) -> float:
        return self.unprotected_retries / self.count("forwarded|passthrough")

    @property
    def unknown_share(self) -> float:
        ok = sum(value for status, value in self.upstream.items() if status.startswith("2"))
        return self.unknown_cost / ok


def yesterday() -> Truth:
    """The day before, as the backfill writes it: cheap calls, few duplicates."""
    truth = Truth()
    truth.requests[("forwarded", "2xx")] = 200
    truth.requests[("replayed", "2xx")] = 4
    truth.requests[("passthrough", "2xx")] = 20
    truth.upstream["200"] = 220
    truth.unprotected_retries = 1
    truth.cost[CHEAP] = 220 * 1e-5
    truth.saved[CHEAP] = 4 * 1e-5
    truth.tokens[("spent", "input")] = 220 * 10
    truth.tokens[("spent", "output")] = 220 * 16
    return truth


def series_of(truth: Truth) -> list[tuple[str, str, dict[str, str], float]]:
    """(family, sample name, labels, value) of the counters a gateway exports for ``truth``."""
    found: list[tuple[str, str, dict[str, str], float]] = []
    for (outcome, klass), value in truth.requests.items():
        labels = {"outcome": outcome, "status_class": klass}
        found.append(("payonce_requests", "payonce_requests_total", labels, value))
    for kind, value in truth.prevented.items():
        found.append(
            (
                "payonce_duplicates_prevented",
                "payonce_duplicates_prevented_total",
                {"kind": kind},
                value,
            )
        )
    for status, value in truth.upstream.items():
        found.append(
            (
                "payonce_upstream_calls",
                "payonce_upstream_calls_total",
                {"status": status},
                value,
            )
        )
    for (kind, direction), value in truth.tokens.items():
        labels = {"kind": kind, "direction": direction}
        found.append(("payonce_tokens", "payonce_tokens_total", labels, value))
    for model, value in truth.cost.items():
        found.append(("payonce_cost_usd", "payonce_cost_usd_total", {"model": model}, value))
    for model, value in truth.saved.items():
        found.append(
            ("payonce_saved_cost_usd", "payonce_saved_cost_usd_total", {"model": model}, value)
        )
    for family, value in (
        ("payonce_unprotected_retries", truth.unprotected_retries),
        ("payonce_store_errors", truth.store_errors),
        ("payonce_unknown_cost_calls", truth.unknown_cost),
        ("payonce_unprotected_forwards", truth.unprotected_forwards),
    ):
        found.append((family, family + "_total", {}, value))
    return found


def openmetrics(truth: Truth, stamps_ms: Sequence[int], instance: str) -> str:
    """``truth``'s counters as OpenMetrics text: 0 at the first stamp, the totals after."""
    families: dict[str, list[str]] = {}
    for family, sample, labels, value in series_of(truth):
        all_labels = {"job": "payonce", "instance": instance, **labels}
        text = ",".join(f'{name}="{value}"' for name, value in sorted(all_labels.items()))
        lines = families.setdefault(family, [])
        for index, stamp in enumerate(stamps_ms):
            lines.append(f"{sample}{{{text}}} {value if index else 0} {stamp / 1000:.3f}")
    out = []
    for family, lines in families.items():
        out += [f"# TYPE {family} counter", *lines]
    return "\n".join([*out, "# EOF", ""])


# ------------------------------------------------------------------------- Prometheus's arithmetic


def extrapolation(stamps_ms: Sequence[int], at_ms: int) -> float:
    """The factor Prometheus applies to a counter's increase in a window ending at ``at_ms``.

    For a series whose first sample in the window is 0 (Prometheus's
    ``extrapolatedRate``: the zero point stops any extrapolation towards the start):
    (sampled interval + duration to the end) / sampled interval, where the duration to
    the end is replaced by half the average sample spacing when it exceeds 1.1 of it.
    """
    inside = [stamp for stamp in stamps_ms if stamp <= at_ms]
    sampled = (inside[-1] - inside[0]) / 1000
    average = sampled / (len(inside) - 1)
    to_end = (at_ms - inside[-1]) / 1000
    if to_end >= average * 1.1:
        to_end = average / 2
    return (sampled + to_end) / sampled


def quantile_bucket(
    q: float, observations: Sequence[tuple[float, float]], bounds: Sequence[float]
) -> tuple[float, float]:
    """The (lower, upper) bound of the bucket ``histogram_quantile(q)`` interpolates in.

    The first bucket holds everything up to its bound and is interpolated from 0; a
    rank in the +Inf bucket is answered with the highest finite bound.
    """
    rank = q * sum(weight for _, weight in observations)
    cumulative, lower, below = 0.0, 0.0, -math.inf
    for upper in [*bounds, math.inf]:
        cumulative += sum(weight for value, weight in observations if below < value <= upper)
        if cumulative >= rank:
            return (lower, upper) if upper != math.inf else (bounds[-1], bounds[-1])
        lower = below = upper
    raise AssertionError("unreachable")


def quantile_range(
    q: float, observations: Sequence[tuple[float, float]], bounds: Sequence[float]
) -> tuple[float, float]:
    """:func:`quantile_bucket`, allowing for the call log's rounding to the microsecond."""
    ranges = [
        quantile_bucket(q, [(value + shift, weight) for value, weight in observations], bounds)
        for shift in (-2e-6, 0.0, 2e-6)
    ]
    return min(low for low, _ in ranges), max(high for _, high in ranges)


# ------------------------------------------------------------------------- the scenario


@dataclass
class Sent:
    """One request of the script and what the gateway must have done with it."""

    gateway: str  # instance, host:port
    outcome: str
    status: int
    provider_id: str | None = None  # the answer's id: the ledger entry it was billed as
    unprotected_retry: bool = False


@dataclass
class Hold:
    """Wall-clock bounds of a moment when the in-flight gauges held known values."""

    start: float
    end: float
    in_flight: int
    upstream_runs: int


def body(model: str, text: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 16}


def instance(process: Process) -> str:
    return process.url.removeprefix("http://")


def gateway_gauges(process: Process) -> tuple[float, float]:
    """(client requests in flight, keyed upstream runs) as the gateway reports them."""
    text = httpx.get(process.url + "/_payonce/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        values[name] = value
    return (
        float(values["payonce_in_flight_requests"]),
        float(values["payonce_upstream_in_flight_calls"]),
    )


class Script:
    """Sends the scenario's requests and remembers what each must have been."""

    def __init__(self, gateways: Sequence[Process], db: Path) -> None:
        self.gateways = list(gateways)
        self.db = db
        self.sent: list[Sent] = []
        # One client for the whole script: keep-alive connections (httpx clients are thread-safe).
        self.client = httpx.Client(headers=AUTH, timeout=30)
        self._lock = threading.Lock()
        self._keys = 0
        self._posts = 0

    def __enter__(self) -> Script:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def key(self, prefix: str) -> str:
        with self._lock:
            self._keys += 1
            return f"{prefix}-{self._keys}"

    def post(
        self,
        gateway: Process,
        outcome: str,
        payload: dict[str, Any],
        *,
        key: str | None = None,
        headers: dict[str, str] | None = None,
        status: int = 200,
        unprotected_retry: bool = False,
    ) -> httpx.Response:
        sent = dict(headers or {})
        if key is not None:
            sent["Idempotency-Key"] = key
        with self._lock:
            self._posts += 1
            scenario = SCENARIOS[self._posts % len(SCENARIOS)]
        if scenario is not None:
            sent["X-Payonce-Scenario"] = scenario
        response = self.client.post(
            gateway.url + "/v1/chat/completions", json=payload, headers=sent
        )
        assert response.status_code == status, (outcome, key, response.text)
        replayed = response.headers.get("idempotent-replayed")
        if outcome == "forwarded" and status == 200:
            assert replayed == "false", key
        elif outcome in ("replayed", "joined"):
            assert replayed == "true", key
        provider_id = response.json().get("id") if status == 200 else None
        with self._lock:
            self.sent.append(
                Sent(instance(gateway), outcome, status, provider_id, unprotected_retry)
            )
        return response

    def hold(self, leader: Process, joiners: Sequence[Process], slow: Process) -> Hold:
        """A keyed call kept running upstream, duplicates waiting for it, one slow pass-through.

        Returns the stretch of wall-clock time during which the gateways' in-flight
        gauges sum to the known values (checked on the gateways themselves first).
        """
        key = self.key("hold")
        # Longer than everything before the hold ends, at its slowest: the wait for
        # the gauges (up to 4 s on a busy machine) and the hold itself.
        delay = {"X-Sim-Delay-Ms": str(int((HOLD_SECONDS + 4 + 1.5) * 1000))}
        payload = body(DEAR, "a slow answer everybody waits for")
        expected = (len(joiners) + 2, 1)
        with concurrent.futures.ThreadPoolExecutor(len(joiners) + 2) as pool:
            lead = pool.submit(self.post, leader, "forwarded", payload, key=key, headers=delay)
            wait_for(lambda: sum_gauges(self.gateways)[1] == 1, "the leader to run upstream")
            # Same key and body, no delay header (headers are not in the fingerprint).
            # On a replica without the run, a duplicate waits on the store and is a replay.
            followers = [
                pool.submit(
                    self.post,
                    joiner,
                    "joined" if joiner is leader else "replayed",
                    payload,
                    key=key,
                )
                for joiner in joiners
            ]
            passing = pool.submit(
                self.post, slow, "passthrough", body(CHEAP, "slow and unkeyed"), headers=delay
            )
            # (A short wait: the gauges count a request as it starts, on every worker.)
            wait_for(
                lambda: sum_gauges(self.gateways) == expected, f"{expected} in flight", timeout=4
            )
            start = time.time()
            time.sleep(HOLD_SECONDS)
            end = time.time()
            assert not lead.done(), "the held call ended before the hold did: raise its delay"
            for future in [lead, *followers, passing]:
                future.result()
        return Hold(start, end, *expected)

    @contextlib.contextmanager
    def store_locked(self) -> Iterator[None]:
        """Another process holds the SQLite store's write lock (a backup, an operator)."""
        connection = sqlite3.connect(self.db, isolation_level=None)
        try:
            connection.execute("BEGIN EXCLUSIVE")
            yield
        finally:
            connection.execute("ROLLBACK")
            connection.close()


def sum_gauges(gateways: Sequence[Process]) -> tuple[float, float]:
    values = [gateway_gauges(gateway) for gateway in gateways]
    return sum(v[0] for v in values), sum(v[1] for v in values)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def run_scenario(script: Script, a: Process, b: Process) -> Hold:
    """The scenario, with ``a`` and ``b`` the gateways to send to (the same one, or two replicas).

    On two replicas the mix differs per replica (cheap calls and pass-through on
    ``a``, dear calls and unprotected retries on ``b``, replays across), so a query
    that did not sum over instances would be off by a whole replica's share.
    """
    cheap_keys, dear_keys = [], []
    for index in range(60):
        key = script.key("cheap")
        script.post(a, "forwarded", body(CHEAP, f"cheap question {index}"), key=key)
        cheap_keys.append((key, index))
    for index in range(45):
        key = script.key("dear")
        script.post(b, "forwarded", body(DEAR, f"dear question {index}"), key=key)
        dear_keys.append((key, index))
    for index in range(10):
        script.post(a, "forwarded", body(UNPRICED, f"unpriced {index}"), key=script.key("unpriced"))
    # Replays, some sent by an SDK retrying (retry count 1, with a key: protected).
    for number, (key, index) in enumerate(cheap_keys[:12]):
        headers = {"x-stainless-retry-count": "1"} if number % 2 else None
        script.post(b, "replayed", body(CHEAP, f"cheap question {index}"), key=key, headers=headers)
    for key, index in dear_keys[:6]:
        script.post(b, "replayed", body(DEAR, f"dear question {index}"), key=key)
    # The same keys with another body: 422, the record untouched.
    for key, index in cheap_keys[20:24]:
        script.post(a, "mismatch", body(CHEAP, f"another question {index}"), key=key, status=422)
    # Upstream failures: not billed, returned, the key released.
    for index in range(2):
        script.post(
            a,
            "forwarded",
            body(CHEAP, f"failing {index}"),
            key=script.key("failing"),
            headers={"X-Sim-Fail": "500"},
            status=500,
        )
    # Unkeyed: first attempts, and SDK retries without a key (billed again).
    for index in range(20):
        script.post(
            a,
            "passthrough",
            body(CHEAP, f"unkeyed {index}"),
            headers={"x-stainless-retry-count": "0"},
        )
    for index in range(12):
        script.post(
            b,
            "passthrough",
            body(CHEAP, f"retried unkeyed {index}"),
            headers={"x-stainless-retry-count": "1"},
            unprotected_retry=True,
        )
    # Keyed requests while another process holds the store's write lock: 503.
    with script.store_locked():
        for gateway in (a, b):
            script.post(
                gateway,
                "error",
                body(CHEAP, "store is locked"),
                key=script.key("locked"),
                status=503,
            )
    # Joins: duplicates of a running call, and the in-flight gauges held steady.
    return script.hold(a, [a, a, b] if a is not b else [a, a, a], b)


def call_log_lines(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Every line of the call logs and their rotated files (one log per gateway, workers or not)."""
    lines = []
    for path in paths:
        for found in sorted(path.parent.glob(path.name + "*")):
            lines += [json.loads(line) for line in found.read_text().splitlines() if line]
    return lines


def truth_of(
    sent: Sequence[Sent], ledger: dict[str, Any], logged: Sequence[dict[str, Any]]
) -> Truth:
    """What one gateway (all of ``sent``) should have counted, from the script and the bill.

    ``logged`` are its call log lines: they must say what the script meant, except that a
    duplicate of a call running in another process is a replay, not a join (it waits
    on the store); the joined/replayed split is taken from the log.
    """
    entries = {entry["provider_request_id"]: entry for entry in ledger["entries"]}
    truth = Truth()
    for request in sent:
        klass = "499" if request.status == 499 else f"{request.status // 100}xx"
        truth.requests[(request.outcome, klass)] += 1
        truth.unprotected_retries += request.unprotected_retry
        if request.outcome == "error" and request.status == 503:
            truth.store_errors += 1
        if request.outcome in ("forwarded", "passthrough"):
            truth.upstream[str(request.status)] += 1
        entry = entries.get(request.provider_id) if request.provider_id else None
        if entry is None:
            continue
        paid = request.outcome in ("forwarded", "passthrough")
        kind = "spent" if paid else "saved"
        truth.tokens[(kind, "input")] += entry["input_tokens"]
        truth.tokens[(kind, "output")] += entry["output_tokens"]
        if entry["model"] in PRICED:
            (truth.cost if paid else truth.saved)[entry["model"]] += entry["cost_usd"]
        elif paid:
            truth.unknown_cost += 1
    logged_outcomes = Counter((line["outcome"], line["status"]) for line in logged)
    scripted = Counter((request.outcome, request.status) for request in sent)
    moved = scripted[("joined", 200)] - logged_outcomes[("joined", 200)]
    assert moved >= 0, f"more joins logged than sent: {logged_outcomes}"
    scripted[("joined", 200)] -= moved
    scripted[("replayed", 200)] += moved
    assert +logged_outcomes == +scripted, "the call log does not say what the script did"
    truth.requests[("joined", "2xx")] -= moved
    truth.requests[("replayed", "2xx")] += moved
    for line in logged:
        scenario = line["scenario"]
        labels = {
            "endpoint": line["endpoint"],
            "scenario": "none" if scenario is None else scenario if scenario in LISTED else "other",
        }
        for by, label in labels.items():
            truth.where[("calls", by, label)] += 1
            truth.where[("cost", by, label)] += line["cost_usd"] or 0.0
            truth.where[("duplicates", by, label)] += line["outcome"] in ("replayed", "joined")
            truth.where[("unprotected", by, label)] += line["unprotected_retry"]
    for line in logged:
        if line["outcome"] in ("forwarded", "passthrough") and line["upstream_latency_ms"]:
            upstream = line["upstream_latency_ms"] / 1000
            truth.upstream_latency.append((upstream, 1.0))
            truth.overhead.append((line["latency_ms"] / 1000 - upstream, 1.0))
    return truth


# ------------------------------------------------------------------------- what each query must say


@dataclass
class Expect:
    """A query's expected answer: one value, values by label, a range, or nothing."""

    value: float | None = None
    by: tuple[str, ...] = ()
    values: dict[str, float] | None = None
    between: tuple[float, float] | None = None
    empty: bool = False


def expected_panels(
    today: Truth, before: Truth, window: float, model: str
) -> dict[tuple[int, str], Expect]:
    """(panel id, refId) -> what that target must answer, at the end of the scenario.

    ``model``: the ``$model`` selection, a regex as Grafana sends it.
    """
    selected = re.compile(model)
    per_hour = 3600 / window

    def models(costs: Counter[str]) -> dict[str, float]:
        return {m: v * per_hour for m, v in costs.items() if selected.fullmatch(m)}

    return {
        (2, "A"): Expect(today.cost_per_success),
        (2, "B"): Expect(before.cost_per_success),
        (3, "A"): Expect(today.duplicate_ratio),
        (3, "B"): Expect(before.duplicate_ratio),
        (4, "A"): Expect(today.hit_rate),
        (4, "B"): Expect(before.hit_rate),
        (5, "A"): Expect(today.billed_duplicates),
        (5, "B"): Expect(before.billed_duplicates),
        (6, "A"): Expect(today.spend),
        (6, "B"): Expect(sum(today.saved.values())),
        (8, "A"): Expect(by=("model",), values=models(today.cost)),
        (9, "A"): Expect(by=("model",), values=models(today.saved)),
        (10, "A"): Expect(today.cost_per_success),
        (10, "B"): Expect(before.cost_per_success),
        (11, "A"): Expect(
            by=("direction", "kind"),
            values={f"{d} {k}": v / window for (k, d), v in today.tokens.items()},
        ),
        (12, "A"): Expect(today.unknown_share),
        (14, "A"): Expect(today.duplicate_ratio),
        (14, "B"): Expect(today.hit_rate),
        (14, "C"): Expect(today.billed_duplicates),
        (15, "A"): Expect(by=("kind",), values={k: v / window for k, v in today.prevented.items()}),
        (16, "A"): Expect(today.unprotected_retries / window),
        (16, "B"): Expect(0.0),  # no retry is matched: the gateways run --no-match-sdk-retries
        (18, "A"): Expect(
            by=("outcome",), values={k: v / window for k, v in today.by_outcome().items()}
        ),
        (19, "A"): Expect(
            by=("status_class",), values={k: v / window for k, v in today.by_class().items()}
        ),
        (20, "A"): Expect(
            by=("status",), values={k: v / window for k, v in today.upstream.items()}
        ),
        (22, "A"): Expect(between=quantile_range(0.5, today.upstream_latency, _LATENCY_BUCKETS)),
        (22, "B"): Expect(between=quantile_range(0.99, today.upstream_latency, _LATENCY_BUCKETS)),
        (23, "A"): Expect(between=quantile_range(0.5, today.overhead, _OVERHEAD_BUCKETS)),
        (23, "B"): Expect(between=quantile_range(0.99, today.overhead, _OVERHEAD_BUCKETS)),
        (24, "A"): Expect(0.0),
        (24, "B"): Expect(0.0),
        (25, "A"): Expect(today.store_errors / window),
        (25, "B"): Expect(today.unprotected_forwards / window),
        # No stream meets the store's outage in the scenario: every stream is stored.
        (25, "C"): Expect(0.0),
        # No per-tenant limit is set in the scenario: nothing refused, everything stored.
        (26, "A"): Expect(by=("limit",), values={"in_flight": 0.0, "new_keys": 0.0}),
        (26, "B"): Expect(0.0),
        # The event loop's health has no truth in the call log: the queries answer, with
        # a p99 inside the histograms' bounds (a loop seconds late would be a defect).
        (27, "A"): Expect(between=(0.0, 2.5)),
        (27, "B"): Expect(between=(0.0, 2.5)),
        **where_panels(today, window),
    }


# Issue 34's panels: (panel id, measure, by, per what seconds).
WHERE_PANELS = [
    (29 + index * 4 + offset, measure, by, per)
    for index, by in enumerate(("endpoint", "scenario"))
    for offset, (measure, per) in enumerate(
        (("cost", 3600), ("calls", 60), ("duplicates", 60), ("unprotected", 60))
    )
]


def where_panels(today: Truth, window: float) -> dict[tuple[int, str], Expect]:
    """Spend, calls, duplicates prevented and unprotected retries by endpoint and scenario."""
    found = {}
    for pid, measure, by, per in WHERE_PANELS:
        values = {
            label: value * per / window
            for (kind, axis, label), value in today.where.items()
            if kind == measure and axis == by and value > 0
        }
        found[(pid, "A")] = Expect(by=(by,), values=values) if values else Expect(empty=True)
    return found


def expected_rules(today: Truth, before: Truth) -> dict[str, Expect]:
    """What each alert's expression answers now: its value when it fires, else nothing.

    The conditions are docs/observability.md's table ("The alerts"), restated.
    """

    def fires(condition: bool, value: float) -> Expect:
        return Expect(value) if condition else Expect(empty=True)

    ratio, baseline = today.duplicate_ratio, before.duplicate_ratio
    share, share_before = today.billed_duplicates, before.billed_duplicates
    cost, cost_before = today.cost_per_success, before.cost_per_success
    return {
        "PayonceDuplicateRatioRising": fires(ratio > 0.05 and ratio > 2 * baseline, ratio),
        "PayonceUnprotectedRetriesRising": fires(
            today.unprotected_retries > 10 and share > 2 * share_before,
            today.unprotected_retries,
        ),
        "PayonceCostPerSuccessfulCallJump": fires(
            cost > 1.5 * cost_before and today.successes > 100, cost
        ),
        "PayonceStoreErrors": fires(today.store_errors > 0, today.store_errors),
        "PayonceUnknownCostCalls": fires(today.unknown_share > 0.05, today.unknown_share),
    }


def close(found: float, wanted: float) -> bool:
    return math.isclose(found, wanted, rel_tol=REL, abs_tol=1e-12)


def compare(
    where: str, expr: str, result: list[tuple[dict[str, str], float]], expect: Expect
) -> list[str]:
    """What is wrong with ``result`` (empty when it is what ``expect`` says)."""
    shown = f"{where}\n    {' '.join(expr.split())}\n    got {result}"
    if expect.empty:
        return [] if not result else [f"{shown}\n    wanted nothing"]
    if not result:
        return [f"{shown}\n    returned nothing"]
    if expect.values is not None:
        got = {" ".join(labels.get(name, "") for name in expect.by): v for labels, v in result}
        wrong = [
            name
            for name in set(got) | set(expect.values)
            if not close(
                got.get(name, math.nan if expect.values.get(name) else 0.0),
                expect.values.get(name, 0.0),
            )
        ]
        return [f"{shown}\n    wanted {expect.values} (wrong: {sorted(wrong)})"] if wrong else []
    if len(result) != 1:
        return [f"{shown}\n    wanted one series"]
    value = result[0][1]
    if expect.between is not None:
        low, high = expect.between
        return [] if low <= value <= high else [f"{shown}\n    wanted within {expect.between}"]
    assert expect.value is not None
    return [] if close(value, expect.value) else [f"{shown}\n    wanted {expect.value!r}"]


_VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)\]\]")


def fill(expr: str, variables: dict[str, str]) -> str:
    """Grafana's interpolation of ``$var``, ``${var}``, ``${var:format}`` and ``[[var]]``."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        assert name in variables, f"the test does not fill the dashboard variable ${name}"
        return variables[name]

    return _VARIABLE.sub(value, expr)


# ------------------------------------------------------------------------- running it all


@dataclass
class Setup:
    prometheus: Prometheus
    started: float  # wall clock just before the backfill and Prometheus's start
    before: Truth


@contextlib.contextmanager
def prometheus_for(targets: Sequence[str], work: Path) -> Iterator[Setup]:
    """Prometheus scraping ``targets`` (which may not listen yet), with yesterday backfilled."""
    _, promtool = binaries()
    started = time.time()
    # The day before: YESTERDAY_SECONDS + 1 samples, one a second, the last a day ago.
    last_ms = int((started - DAY) * 1000)
    stamps = [
        last_ms - 1000 * (YESTERDAY_SECONDS - index) for index in range(YESTERDAY_SECONDS + 1)
    ]
    before = yesterday()
    data = work / "data"
    backfill(promtool, openmetrics(before, stamps, "yesterday:8080"), data, work)
    config = scrape_config(targets, RULES)
    with running_prometheus(config, work, data=data) as prometheus:
        yield Setup(prometheus, started, before)


def scrapes(prometheus: Prometheus, targets: Sequence[str]) -> dict[str, list[int]]:
    """Timestamps (ms) of every successful scrape of each target so far."""
    found: dict[str, list[int]] = {target: [] for target in targets}
    data = prometheus.api(
        "/api/v1/query", {"query": 'up{job="payonce"}[10m]', "time": f"{time.time():.3f}"}
    )
    for item in data["result"]:
        target = item["metric"]["instance"]
        if target in found:
            found[target] = [
                round(float(ts) * 1000) for ts, value in item["values"] if value == "1"
            ]
    return found


def evaluate(
    setup: Setup,
    gateways: Sequence[Process],
    hold: Hold,
    truths: Callable[[], dict[str, Truth]],
) -> None:
    """Evaluate every panel target and rule; fail with every wrong one listed.

    ``truths``: what each gateway (by instance) should have counted, asked once the
    scenario's last counts have been scraped.
    """
    prometheus = setup.prometheus
    targets = [instance(gateway) for gateway in gateways]
    finished = time.time()
    # Wait for a scrape of every target after the last answer (and its counting).
    wait_for(
        lambda: all(
            s and s[-1] / 1000 > finished + 0.3 for s in scrapes(prometheus, targets).values()
        ),
        "a scrape of every gateway after the scenario",
    )
    counted = truths()
    stamps = scrapes(prometheus, targets)
    at_ms = max(s[-1] for s in stamps.values())
    at = at_ms / 1000
    # The first scrape of each target is in every window (W, 5m): nothing before it.
    window = math.ceil(at - setup.started) + YESTERDAY_SECONDS + 5
    assert at - min(s[0] for s in stamps.values()) / 1000 < 290, "the test ran too long for [5m]"
    # What each target's counters extrapolate to at `at` (1 for the target scraped at `at`).
    series = prometheus.samples("payonce_unprotected_retries_total[10m]", at)
    factors = {
        labels["instance"]: extrapolation([round(ts * 1000) for ts in ts_list], at_ms)
        for labels, ts_list in series
        if labels["instance"] in targets
    }
    assert set(factors) == set(targets), factors
    today = Truth()
    for target, truth in counted.items():
        today = today + truth.scaled(factors[target])

    problems: list[str] = []
    dashboard = load_dashboard()
    panels = {panel["id"]: panel for panel in query_panels(dashboard)}
    for model in (".*", DEAR, f"({DEAR}|{CHEAP})"):
        expected = expected_panels(today, setup.before, window, model)
        targets_found = {(pid, t["refId"]) for pid, p in panels.items() for t in p["targets"]}
        assert targets_found == set(expected), (
            "every panel target needs an expectation here (and only those):"
            f" {sorted(targets_found ^ set(expected))}"
        )
        variables = {
            "__rate_interval": f"{window}s",
            "__interval": f"{window}s",
            "__range": "1d",
            "model": model,
        }
        for (pid, ref), expect in expected.items():
            target = next(t for t in panels[pid]["targets"] if t["refId"] == ref)
            expr = fill(target["expr"], variables)
            where = f"panel {pid} {panels[pid]['title']!r} {ref} ($model={model})"
            problems += compare(where, expr, prometheus.query(expr, at), expect)
    # In flight, at a scrape of every target inside the hold.
    inside = [
        min(stamp for stamp in s if stamp / 1000 > hold.start + 0.05) for s in stamps.values()
    ]
    held_at = max(inside) / 1000
    assert held_at < hold.end - 0.05, "no scrape of every gateway inside the hold"
    for ref, value in (("A", hold.in_flight), ("B", hold.upstream_runs)):
        target = next(t for t in panels[24]["targets"] if t["refId"] == ref)
        where = f"panel 24 'In flight' {ref} during the hold"
        problems += compare(
            where, target["expr"], prometheus.query(target["expr"], held_at), Expect(value)
        )
    # The model variable: what Grafana lists for it.
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "model")
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\s*\)", variable_query(variable).strip())
    assert match, variable_query(variable)
    listed = set(prometheus.label_values(match.group(2), match.group(1), at - 3600, at))
    usual = {priced_name(name) for name in USUAL_MODELS}
    if not (PRICED <= listed <= set(PRICES) | usual | {"other"}):
        problems.append(f"variable $model lists {sorted(listed)}")
    # Every alert rule Prometheus loaded, evaluated now.
    rules = {rule["name"]: rule for rule in prometheus.rules() if rule["type"] == "alerting"}
    wanted = expected_rules(today, setup.before)
    assert set(rules) == set(wanted), sorted(set(rules) ^ set(wanted))
    for name, rule in rules.items():
        assert rule["health"] in ("ok", "unknown"), rule
        problems += compare(
            f"rule {name}", rule["query"], prometheus.query(rule["query"], at), wanted[name]
        )
    assert not problems, "\n".join(["wrong answers:", *problems])


def check_metrics(gateway: Process) -> None:
    """``promtool check metrics`` on a real scrape: names, types, help, units."""
    _, promtool = binaries()
    text = httpx.get(gateway.url + "/_payonce/metrics", timeout=10).text
    done = subprocess.run(
        [promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def start_gateways(
    sim: Sim, work: Path, ports: Sequence[int], *flags: str
) -> tuple[list[Process], list[Path], Path]:
    """Gateways on ``ports`` in front of ``sim``, one SQLite store, a call log each."""
    db = work / "store.db"
    logs = [work / f"calls-{index}.jsonl" for index in range(len(ports))]
    gateways = []
    for port, log in zip(ports, logs, strict=True):
        args = [
            "serve",
            "--upstream",
            sim.url,
            "--store",
            # A short wait for the store's lock: the scenario's locked store answers 503 soon.
            f"sqlite:///{db}?timeout=0.5",
            "--call-log",
            str(log),
            "--no-otel",
            "--log-level",
            "warning",
            # The script's unkeyed SDK retries are the unprotected, billed kind
            # (matched ones: tests/gateway/test_sdk_retries.py).
            "--no-match-sdk-retries",
            "--scenarios",
            ",".join(LISTED),
            *flags,
        ]
        gateways.append(start_payonce(args, log_dir=work, ready_path="/_payonce/health", port=port))
    return gateways, logs, db


def scenario_test(sim: Sim, work: Path, replicas: int, *flags: str) -> None:
    """The scenario through ``replicas`` gateways (``flags`` for each), every query checked."""
    ports = [free_port() for _ in range(replicas)]
    targets = [f"127.0.0.1:{port}" for port in ports]
    gateways: list[Process] = []
    # Prometheus first: its first scrape comes some 5 s after it starts (2.42's target
    # updates are sent every 5 s), the gateways start meanwhile.
    with prometheus_for(targets, work) as setup:
        try:
            gateways, logs, db = start_gateways(sim, work, ports, *flags)
            # A scrape of every gateway before any traffic: every series' first sample is 0.
            wait_for(
                lambda: all(scrapes(setup.prometheus, targets).values()),
                "a scrape of every gateway",
                timeout=30,
            )
            with Script(gateways, db) as script:
                hold = run_scenario(script, gateways[0], gateways[-1])

                def truths() -> dict[str, Truth]:
                    wait_for(
                        lambda: len(call_log_lines(logs)) == len(script.sent),
                        "every request in the call logs",
                    )
                    ledger = sim.ledger()
                    return {
                        instance(gateway): truth_of(
                            [s for s in script.sent if s.gateway == instance(gateway)],
                            ledger,
                            call_log_lines([log]),
                        )
                        for gateway, log in zip(gateways, logs, strict=True)
                    }

                evaluate(setup, gateways, hold, truths)
            for gateway in gateways:
                check_metrics(gateway)
        finally:
            for gateway in gateways:
                gateway.stop()


def test_dashboard_and_rules_on_a_real_prometheus(fresh_sim: Sim, tmp_path: Path) -> None:
    scenario_test(fresh_sim, tmp_path, 1)


def test_dashboard_and_rules_with_two_workers(fresh_sim: Sim, tmp_path: Path) -> None:
    scenario_test(fresh_sim, tmp_path, 1, "--workers", "2")


def test_dashboard_sums_two_replicas(fresh_sim: Sim, tmp_path: Path) -> None:
    """docs/observability.md: one target per replica, every panel and rule sums them."""
    scenario_test(fresh_sim, tmp_path, 2)
