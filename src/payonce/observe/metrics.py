"""The gateway's Prometheus metrics, served at ``/_payonce/metrics``.

Every name here is what ``deploy/grafana/payonce.json`` queries (a test checks
that). Labels stay low-cardinality: no tenant, key or model label on counters
that grow per request, except ``model`` on cost counters, whose values are the
names of what priced them (``--prices`` entries, genai-prices model ids) and
``other``: never a name a caller made up (:func:`model_label`).

Idempotency hit rate: ``(replayed + joined) / (forwarded + replayed + joined)``
from ``payonce_requests_total{outcome}``. Cost per successful call:
``payonce_cost_usd_total`` over ``payonce_requests_total{status_class="2xx"}``.

One process (``payonce serve``): the metrics live in memory and are counted
into prometheus-client at scrape time (:class:`Deferred`). Several
(``--workers N``): each worker's metrics live in prometheus-client's
multiprocess files in a directory the supervisor made (``Metrics(shared=DIR)``),
each count written as it is made (:class:`Slots`); a scrape, whichever worker
takes it, sums every file, dead workers' included (docs/observability.md, "Workers").
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sized
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

from payonce.observe.counting import Buckets, Deferred, Slot, Slots, use_values
from payonce.observe.limit_metrics import limit_counters
from payonce.observe.pricing import PRICES, USUAL_MODELS, priced_name
from payonce.observe.scenarios import ENDPOINTS, Scenarios

if TYPE_CHECKING:
    from payonce.observe.calllog import CallRecord
    from payonce.observe.facts import UpstreamFacts

__all__ = ["CONTENT_TYPE_LATEST", "OUTCOMES", "Metrics", "model_label", "status_class"]

OUTCOMES = (
    "forwarded",
    "replayed",
    "joined",
    "conflict",
    "mismatch",
    "rejected",
    "passthrough",
    "error",
)
# "499": the client left before its answer was complete (nginx's "client closed
# request"); kept apart from 4xx, which are answers the client received.
_STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "499", "5xx")
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_OVERHEAD_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1,
)  # fmt: skip
_PAUSE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


# Distinct raw model names whose counter children are remembered, before the
# memory starts again (callers choose model names, so they are unbounded).
_MODEL_CHILDREN = 256
# Upstream statuses counted from 0 when the gateway starts (None: no response,
# -1: cancelled); any other status gets its series when it first happens.
_UPSTREAM_STATUSES = (
    200, 400, 401, 403, 404, 408, 409, 413, 422, 429, 500, 502, 503, 504, 529, None, -1,
)  # fmt: skip


def model_label(model: str | None) -> str:
    """The ``model`` label of a call: its price table entry, else ``other``.

    A dated snapshot (``gpt-4o-2024-08-06``) is labelled with the entry that
    prices it (``gpt-4o``), and so is any name starting with a priced one; a
    model the table does not know, or none, is ``other``.
    """
    name = priced_name(model) if model is not None else None
    return name if name is not None else "other"


def status_class(status: int) -> str:
    """The ``status_class`` label of a client status: ``499`` apart, else ``2xx`` ..."""
    if status == 499:
        return "499"
    return f"{min(max(status // 100, 1), 5)}xx"


class Metrics:
    """One registry per gateway process. Updates are deferred (:class:`Deferred`).

    ``shared``: the directory of a ``--workers`` gateway's metrics, where this
    worker writes its counts (as an upstream call or a request ends) and
    from which a scrape sums all the workers'. ``None``: this process alone, in memory.
    """

    def __init__(self, shared: str | None = None, scenarios: Scenarios | None = None) -> None:
        use_values(shared)
        self.shared = shared is not None
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.deferred = Deferred()
        requests = Counter(
            "payonce_requests",
            "Client requests answered, by outcome and status class.",
            ["outcome", "status_class"],
            registry=registry,
        )
        self._requests = {
            (outcome, status_class): requests.labels(outcome, status_class)
            for outcome in OUTCOMES
            for status_class in _STATUS_CLASSES
        }
        self.upstream_calls = Counter(
            "payonce_upstream_calls",
            "Calls made to the upstream, by status ('error' when no response came back,"
            " 'cancelled' when the gateway stopped it because its client left).",
            ["status"],
            registry=registry,
        )
        self.duplicates_prevented = Counter(
            "payonce_duplicates_prevented",
            "Requests answered without an upstream call: replayed or joined.",
            ["kind"],
            registry=registry,
        )
        self.tokens = Counter(
            "payonce_tokens",
            "Tokens of upstream calls made (spent) or answered without a call (saved).",
            ["kind", "direction"],
            registry=registry,
        )
        self.cost = Counter(
            "payonce_cost_usd",
            "Cost of upstream calls made, in USD, at list prices.",
            ["model"],
            registry=registry,
        )
        self.saved_cost = Counter(
            "payonce_saved_cost_usd",
            "What replays and joins would have cost as new upstream calls, in USD.",
            ["model"],
            registry=registry,
        )
        self.unknown_cost = Counter(
            "payonce_unknown_cost_calls",
            "Upstream calls whose cost is unknown (model not in the price table, or no usage).",
            registry=registry,
        )
        self.unprotected_retries = Counter(
            "payonce_unprotected_retries",
            "SDK retries (x-stainless-retry-count > 0) that carried no idempotency key.",
            registry=registry,
        )
        self.sdk_retries_matched = Counter(
            "payonce_sdk_retries_matched",
            "SDK retries without a key (x-stainless-retry-count > 0) answered from the run"
            " of an earlier attempt with the same body: joined or replayed, never billed.",
            registry=registry,
        )
        self.store_errors = Counter(
            "payonce_store_errors",
            "Requests that failed because the idempotency store could not answer.",
            registry=registry,
        )
        self.upstream_latency = Histogram(
            "payonce_upstream_latency_seconds",
            "Time waiting for the upstream (to the whole response, or a stream's end).",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.overhead = Histogram(
            "payonce_gateway_overhead_seconds",
            "Time the gateway added to a forwarded request (total minus upstream).",
            buckets=_OVERHEAD_BUCKETS,
            registry=registry,
        )
        # The event loop's own health (payonce/collector.py): with workers, summed.
        self.gc_pause = Histogram(
            "payonce_gc_pause_seconds",
            "Time the event loop stood still in CPython's cycle collector, per collection.",
            buckets=_PAUSE_BUCKETS,
            registry=registry,
        )
        self.loop_lag = Histogram(
            "payonce_event_loop_lag_seconds",
            "How late the event loop ran a timer due every 0.1 s: how long a ready"
            " request could have waited for its next step.",
            buckets=_PAUSE_BUCKETS,
            registry=registry,
        )
        # With workers: the sum over the live workers (the supervisor removes a
        # dead worker's file, so what it had in flight does not linger).
        self.in_flight = Gauge(
            "payonce_in_flight_requests",
            "Client requests being answered right now.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.upstream_in_flight = Gauge(
            "payonce_upstream_in_flight_calls",
            "Keyed upstream runs in progress.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.unprotected_forwards = Counter(
            "payonce_unprotected_forwards",
            "Keyed requests forwarded without protection (nothing claimed or stored) because"
            " the store could not answer (--on-store-failure open).",
            registry=registry,
        )
        self.limited, self.unstored = limit_counters(registry)  # children by label
        # By endpoint and scenario (observe/scenarios.py): both fixed sets of values,
        # the scenarios the operator's --scenarios list, "other" and "none".
        by_scenario = ["endpoint", "scenario"]
        self.scenario_requests = Counter(
            "payonce_scenario_requests",
            "Client requests answered, by endpoint and business scenario.",
            by_scenario,
            registry=registry,
        )
        self.scenario_cost = Counter(
            "payonce_scenario_cost_usd",
            "Cost of upstream calls made, in USD, by endpoint and business scenario.",
            by_scenario,
            registry=registry,
        )
        self.scenario_duplicates = Counter(
            "payonce_scenario_duplicates_prevented",
            "Requests answered without an upstream call (replayed or joined), by endpoint"
            " and business scenario.",
            by_scenario,
            registry=registry,
        )
        self.scenario_unprotected = Counter(
            "payonce_scenario_unprotected_retries",
            "SDK retries without an idempotency key, by endpoint and business scenario.",
            by_scenario,
            registry=registry,
        )
        # (endpoint, scenario label) -> its (requests, cost, duplicates, unprotected)
        # children, every one created at 0 (see below).
        self._by_scenario: dict[tuple[str | None, str], tuple[Any, Any, Any, Any]] = {
            (endpoint, label): (
                self.scenario_requests.labels(endpoint, label),
                self.scenario_cost.labels(endpoint, label),
                self.scenario_duplicates.labels(endpoint, label),
                self.scenario_unprotected.labels(endpoint, label),
            )
            for endpoint in ENDPOINTS
            for label in (scenarios or Scenarios()).labels()
        }

        # Children bound once: .labels() is a lock and a dict lookup per call.
        self.spent_input = self.tokens.labels("spent", "input")
        self.spent_output = self.tokens.labels("spent", "output")
        self.saved_input = self.tokens.labels("saved", "input")
        self.saved_output = self.tokens.labels("saved", "output")
        self._duplicates = {
            kind: self.duplicates_prevented.labels(kind) for kind in ("replayed", "joined")
        }
        self._saved_costs: dict[str | None, Any] = {}
        self.upstream_latency_buckets = Buckets(self.upstream_latency, _LATENCY_BUCKETS)
        self.overhead_buckets = Buckets(self.overhead, _OVERHEAD_BUCKETS)
        self.gc_pause_buckets = Buckets(self.gc_pause, _PAUSE_BUCKETS)
        self.loop_lag_buckets = Buckets(self.loop_lag, _PAUSE_BUCKETS)
        self.deferred.histograms += [
            self.upstream_latency_buckets,
            self.overhead_buckets,
            self.gc_pause_buckets,
            self.loop_lag_buckets,
        ]
        self.in_flight_now = 0
        self._runs: Sized = ()  # the keyed runs in progress (count_runs)
        self._costs: dict[str | None, Any] = {}
        self._upstream_statuses: dict[int | None, Any] = {}
        self._answered: dict[tuple[str, int], int] = {}  # (outcome, status) -> requests
        # Series that exist at 0 from the start: Prometheus's rate() and increase()
        # take a series' first sample as its starting point, so a child created with
        # its first counts in it would lose them (after every restart, the first
        # scrape interval's spend of each model). The label values known in advance
        # are: every --prices entry (installed before the gateway is built), the usual
        # models (pricing.USUAL_MODELS) and the usual upstream statuses.
        usual = (priced_name(model) for model in USUAL_MODELS)
        for name in dict.fromkeys([*PRICES, *(name for name in usual if name is not None)]):
            self.cost.labels(name)
            self.saved_cost.labels(name)
        for status in _UPSTREAM_STATUSES:
            self.upstream_child(status)
        if shared is None:
            self.in_flight.set_function(lambda: self.in_flight_now)
            self.upstream_in_flight.set_function(lambda: len(self._runs))
            self._scraped = registry
        else:
            self._places = places = Slots()
            self._slots: dict[Any, Slot] = {}  # counter child -> its slot
            self._answered_slots: dict[tuple[str, int], tuple[Slot, ...]] = {}
            self._in_flight_slot = places.of(self.in_flight._value)
            self._runs_slot = places.of(self.upstream_in_flight._value)
            self._spent_input_slot = self._slot_of(self.spent_input)
            self._spent_output_slot = self._slot_of(self.spent_output)
            for buckets in self.deferred.histograms:
                buckets.share(places)
            # No auto_describe: it reads every file now, and a starting worker's is half made.
            self._scraped = CollectorRegistry(auto_describe=False)
            MultiProcessCollector(self._scraped, path=shared)  # type: ignore[no-untyped-call]

    def _scenario_children(self, key: tuple[str | None, str]) -> tuple[Any, Any, Any, Any]:
        """The children of a label pair not made at start (a record from elsewhere): other.

        A request to the gateway's own paths names no endpoint (None): labelled ``other``.
        """
        endpoint, label = key
        if endpoint is None:
            found = self._by_scenario.get(("other", label))
            if found is not None:
                return found
        return (
            self._by_scenario.get((endpoint or "other", "other"))
            or self._by_scenario[("other", "other")]
        )

    def observe_gc_pause(self, seconds: float) -> None:
        """One collection's pause (``payonce_gc_pause_seconds``)."""
        self.gc_pause_buckets.observe(seconds)

    def observe_loop_lag(self, seconds: float) -> None:
        """One tick's lateness (``payonce_event_loop_lag_seconds``), every 0.1 s.

        With workers, written to this worker's file at once: an idle worker handles
        no request that would publish it, and a scrape reads only the files.
        """
        self.loop_lag_buckets.observe(seconds)
        if self.shared:
            self.loop_lag_buckets.publish()
            self.gc_pause_buckets.publish()

    def count_runs(self, runs: Sized) -> None:
        """``payonce_upstream_in_flight_calls`` is ``len(runs)``, the keyed runs in progress."""
        self._runs = runs

    def publish(self) -> None:
        """With workers, write the counts still kept in memory to the file; else nothing.

        The request path writes its own counts as it makes them
        (:meth:`_upstream_call_shared`, :meth:`_answered_shared`); this writes the
        rest (tokens and cost saved, unprotected retries), at the end of each
        request and before a scrape.
        """
        if not self.shared:
            return
        answered = self._answered
        if answered:
            for key, count in answered.items():
                for view, index in self._answered_slots.get(key) or self._answered_slots_of(key):
                    view[index] += count
            answered.clear()
        counts = self.deferred.counts
        if counts:
            slots = self._slots
            for child, amount in counts.items():
                if amount:
                    view, index = slots.get(child) or self._slot_of(child)
                    view[index] += amount
            counts.clear()
        for buckets in self.deferred.histograms:
            buckets.publish()
        self.publish_gauges()

    def _slot_of(self, child: Any) -> Slot:
        slot = self._slots[child] = self._places.of(child._value)
        return slot

    def _answered_slots_of(self, key: tuple[str, int]) -> tuple[Slot, ...]:
        """The values an answered (outcome, status) adds to (as :meth:`_apply_answered`)."""
        outcome, status = key
        found = [self._requests[(outcome, status_class(status))]]
        if outcome in ("replayed", "joined"):
            found.append(self._duplicates[outcome])
        elif outcome == "error" and status == 503:
            found.append(self.store_errors)
        if len(self._answered_slots) >= 4096:  # statuses come from upstreams: bounded
            self._answered_slots.clear()
        slots = self._answered_slots[key] = tuple(self._places.of(c._value) for c in found)
        return slots

    def publish_gauges(self) -> None:
        """With workers, write both in-flight gauges to the file; else nothing."""
        if not self.shared:
            return
        view, index = self._in_flight_slot
        view[index] = self.in_flight_now
        self.runs_changed()

    def started(self) -> None:
        """With workers: a request started (``in_flight_now`` is already counted)."""
        view, index = self._in_flight_slot
        view[index] = self.in_flight_now

    def runs_changed(self) -> None:
        """With workers: a keyed upstream run started or ended."""
        view, index = self._runs_slot
        view[index] = len(self._runs)

    def cost_of(self, model: str | None) -> Any:
        """The cost counter of ``model``, labelled :func:`model_label` (children cached)."""
        child = self._costs.get(model)
        if child is None:
            if len(self._costs) >= _MODEL_CHILDREN:
                self._costs.clear()
            child = self._costs[model] = self.cost.labels(model_label(model))
        return child

    def saved_cost_of(self, model: str | None) -> Any:
        child = self._saved_costs.get(model)
        if child is None:
            if len(self._saved_costs) >= _MODEL_CHILDREN:
                self._saved_costs.clear()
            child = self._saved_costs[model] = self.saved_cost.labels(model_label(model))
        return child

    def upstream_child(self, status: int | None) -> Any:
        """The upstream-calls counter of ``status`` (``None``: no answer; -1: cancelled)."""
        child = self._upstream_statuses.get(status)
        if child is None:
            label = "cancelled" if status == -1 else str(status) if status else "error"
            child = self._upstream_statuses[status] = self.upstream_calls.labels(label)
        return child

    def upstream_call(self, facts: UpstreamFacts) -> None:
        """Count one upstream call: its status, latency, tokens and cost.

        Once per upstream call, so inlined: each update is a dict add (no calls).
        """
        if self.shared:
            self._upstream_call_shared(facts)
            return
        counts = self.deferred.counts
        status = -1 if facts.cancelled else facts.status
        child = self._upstream_statuses.get(status) or self.upstream_child(status)
        counts[child] = counts.get(child, 0.0) + 1.0
        latency = facts.latency
        if latency is not None:  # Buckets.observe, inlined
            buckets = self.upstream_latency_buckets
            buckets.counts[bisect_left(buckets.bounds, latency)] += 1
            buckets.total += latency
        usage = facts.usage
        if usage:
            child = self.spent_input
            counts[child] = counts.get(child, 0.0) + usage.get("input_tokens", 0)
            child = self.spent_output
            counts[child] = counts.get(child, 0.0) + usage.get("output_tokens", 0)
        cost = facts.cost_usd
        if cost is not None:
            child = self._costs.get(facts.model) or self.cost_of(facts.model)
            counts[child] = counts.get(child, 0.0) + cost
        elif status is not None and 0 < status < 300:  # -1: cancelled, no answer
            child = self.unknown_cost
            counts[child] = counts.get(child, 0.0) + 1.0

    def _upstream_call_shared(self, facts: UpstreamFacts) -> None:
        """:meth:`upstream_call` with workers: each count written to the file at once.

        Each update is one store into the mapped file (:class:`Slots`), found
        through a slot resolved once per series.
        """
        slots = self._slots
        status = -1 if facts.cancelled else facts.status
        child = self._upstream_statuses.get(status) or self.upstream_child(status)
        view, index = slots.get(child) or self._slot_of(child)
        view[index] += 1.0
        latency = facts.latency
        if latency is not None:
            buckets = self.upstream_latency_buckets
            view, index = buckets.slots[bisect_left(buckets.bounds, latency)]
            view[index] += 1.0
            view, index = buckets.sum_slot
            view[index] += latency
        usage = facts.usage
        if usage:
            view, index = self._spent_input_slot
            view[index] += usage.get("input_tokens", 0)
            view, index = self._spent_output_slot
            view[index] += usage.get("output_tokens", 0)
        cost = facts.cost_usd
        if cost is not None:
            child = self._costs.get(facts.model) or self.cost_of(facts.model)
            view, index = slots.get(child) or self._slot_of(child)
            view[index] += cost
        elif status is not None and 0 < status < 300:  # -1: cancelled, no answer
            view, index = slots.get(self.unknown_cost) or self._slot_of(self.unknown_cost)
            view[index] += 1.0
        view, index = self._runs_slot
        view[index] = len(self._runs)

    def answered(self, record: CallRecord, finished: float) -> None:
        """Count one answered client request (``finished``: its ``perf_counter()``).

        Once per request, so only one count on the hot path, by (outcome, status):
        the requests, duplicates and store-error counters are all derived from
        those counts when someone scrapes (:meth:`_apply_answered`).
        """
        if self.shared:
            self._answered_shared(record, finished)
            return
        self.in_flight_now -= 1
        outcome = record.outcome
        answered = self._answered
        key = (outcome, record.status)
        answered[key] = answered.get(key, 0) + 1
        counts = self.deferred.counts
        key2 = (record.endpoint, record.scenario_label)
        children = self._by_scenario.get(key2) or self._scenario_children(key2)
        child = children[0]
        counts[child] = counts.get(child, 0.0) + 1.0
        cost = record.cost_usd
        if cost:
            child = children[1]
            counts[child] = counts.get(child, 0.0) + cost
        if outcome == "joined" or outcome == "replayed":
            child = children[2]
            counts[child] = counts.get(child, 0.0) + 1.0
        if record.unprotected_retry:
            self.deferred.add(self.unprotected_retries)
            self.deferred.add(children[3])
        elif record.sdk_match == "retry" and (outcome == "joined" or outcome == "replayed"):
            self.deferred.add(self.sdk_retries_matched)
        latency = record.upstream_latency
        if latency is not None and (outcome == "forwarded" or outcome == "passthrough"):
            overhead = finished - record.started - latency
            if overhead > 0.0:  # Buckets.observe, inlined (0 adds nothing to the sum)
                buckets = self.overhead_buckets
                buckets.counts[bisect_left(buckets.bounds, overhead)] += 1
                buckets.total += overhead
            else:
                self.overhead_buckets.counts[0] += 1

    def _answered_shared(self, record: CallRecord, finished: float) -> None:
        """:meth:`answered` with workers: each count written to the file at once."""
        self.in_flight_now -= 1
        outcome = record.outcome
        key = (outcome, record.status)
        for view, index in self._answered_slots.get(key) or self._answered_slots_of(key):
            view[index] += 1.0
        slots = self._slots
        key2 = (record.endpoint, record.scenario_label)
        children = self._by_scenario.get(key2) or self._scenario_children(key2)
        view, index = slots.get(children[0]) or self._slot_of(children[0])
        view[index] += 1.0
        cost = record.cost_usd
        if cost:
            view, index = slots.get(children[1]) or self._slot_of(children[1])
            view[index] += cost
        if outcome == "joined" or outcome == "replayed":
            view, index = slots.get(children[2]) or self._slot_of(children[2])
            view[index] += 1.0
        if record.unprotected_retry:
            self.deferred.add(self.unprotected_retries)
            self.deferred.add(children[3])
        elif record.sdk_match == "retry" and (outcome == "joined" or outcome == "replayed"):
            self.deferred.add(self.sdk_retries_matched)
        latency = record.upstream_latency
        if latency is not None and (outcome == "forwarded" or outcome == "passthrough"):
            overhead = finished - record.started - latency
            buckets = self.overhead_buckets
            if overhead > 0.0:
                view, index = buckets.slots[bisect_left(buckets.bounds, overhead)]
                view[index] += 1.0
                view, index = buckets.sum_slot
                view[index] += overhead
            else:
                view, index = buckets.slots[0]
                view[index] += 1.0
        view, index = self._in_flight_slot
        view[index] = self.in_flight_now
        if self.deferred.counts:  # saved tokens and cost, unprotected retries
            self.publish()

    def _apply_answered(self) -> None:
        answered, self._answered = self._answered, {}
        for (outcome, status), count in answered.items():
            self._requests[(outcome, status_class(status))].inc(count)
            if outcome in ("replayed", "joined"):
                self._duplicates[outcome].inc(count)
            elif outcome == "error" and status == 503:
                self.store_errors.inc(count)

    def render(self) -> bytes:
        """The exposition: this process's metrics, or with workers the sum of all of theirs."""
        if self.shared:
            # The fast path owns the values: prometheus-client's inc() would start
            # from its own copy in memory, which the fast path does not keep.
            self.publish()
        else:
            self._apply_answered()
            self.deferred.apply()
        return generate_latest(self._scraped)
