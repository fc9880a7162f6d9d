"""A ``--workers`` worker's metrics in prometheus-client's multiprocess files, in-process.

The gateway tests check the sums across real workers; these pin what the fast
path relies on in prometheus-client (``MmapedValue._file`` and ``._key``,
``MmapedDict._m`` and ``._positions``, the value's double at its position) and
that a file grown by new series still takes the counts of the older ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import values
from prometheus_client.mmap_dict import MmapedDict

from payonce.clock import ManualClock
from payonce.gateway.observing import Observer, UpstreamFacts
from payonce.observe.metrics import Metrics
from tests.support.exposition import metric


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A shared directory for this test; prometheus-client's process state put back after."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)
    # Metrics(shared) sets it: recorded here so that it is unset again after the test.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    return directory


def forwarded(observer: Observer, model: str = "gpt-4o-mini", status: int = 200) -> None:
    record = observer.start("POST", "/v1/chat/completions", "t", [])
    facts = UpstreamFacts(status=status, model=model, cost_usd=0.25, latency=0.02, attempts=1)
    facts.usage = {"input_tokens": 3, "output_tokens": 4}
    observer.upstream_call(facts, "/v1/chat/completions")
    record.outcome, record.status, record.key = "forwarded", status, "k"
    record.upstream_latency = 0.02
    observer.finish(record)


def file_values(directory: Path) -> dict[str, float]:
    found: dict[str, float] = {}
    for path in directory.glob("*.db"):
        for key, value, _, _ in MmapedDict.read_all_values_from_file(str(path)):
            found[key] = value
    return found


def test_each_request_lands_in_the_file_and_a_scrape_reads_the_files(shared: Path) -> None:
    metrics = Metrics(str(shared))
    assert values.ValueClass is not values.MutexValue
    observer = Observer(metrics, None, ManualClock())
    for _ in range(3):
        forwarded(observer)
    # Written at the end of each request: in the files before any scrape.
    written = file_values(shared)
    requests = [
        value
        for key, value in written.items()
        if '"payonce_requests_total"' in key and '"forwarded"' in key and '"2xx"' in key
    ]
    assert requests == [3.0]
    text = metrics.render().decode()
    assert metric(text, "payonce_requests_total", outcome="forwarded", status_class="2xx") == 3
    assert metric(text, "payonce_upstream_calls_total", status="200") == 3
    assert metric(text, "payonce_tokens_total", kind="spent", direction="input") == 9
    assert metric(text, "payonce_cost_usd_total", model="gpt-4o-mini") == 0.75
    assert metric(text, "payonce_upstream_latency_seconds_count") == 3
    assert metric(text, "payonce_upstream_latency_seconds_bucket", le="0.025") == 3
    assert metric(text, "payonce_upstream_latency_seconds_bucket", le="0.01") == 0
    assert metric(text, "payonce_upstream_latency_seconds_sum") == pytest.approx(0.06)
    assert metric(text, "payonce_gateway_overhead_seconds_count") == 3
    assert metric(text, "payonce_in_flight_requests") == 0
    assert "_created" not in text
    assert metrics.render().decode() == text  # nothing counted twice


def test_a_scrape_writes_what_is_still_pending_on_top_of_the_file(shared: Path) -> None:
    metrics = Metrics(str(shared))
    observer = Observer(metrics, None, ManualClock())
    forwarded(observer)
    forwarded(observer)
    metrics.deferred.add(metrics.spent_input, 1)  # counted, not yet written
    text = metrics.render().decode()
    assert metric(text, "payonce_tokens_total", kind="spent", direction="input") == 7


def test_the_gauges_follow_requests_in_flight(shared: Path) -> None:
    metrics = Metrics(str(shared))
    observer = Observer(metrics, None, ManualClock())
    records = [observer.start("POST", "/v1/x", "t", []) for _ in range(4)]
    assert metric(metrics.render().decode(), "payonce_in_flight_requests") == 4
    for record in records[:3]:
        record.outcome, record.status = "passthrough", 200
        observer.finish(record)
    assert metric(metrics.render().decode(), "payonce_in_flight_requests") == 1
    runs: dict[str, object] = {"a": 1, "b": 2}
    metrics.count_runs(runs)
    metrics.publish_gauges()
    assert metric(metrics.render().decode(), "payonce_upstream_in_flight_calls") == 2


def test_counts_go_on_when_new_series_grow_the_file(shared: Path) -> None:
    metrics = Metrics(str(shared))
    observer = Observer(metrics, None, ManualClock())
    forwarded(observer)
    counter_file = next(shared.glob("counter_*.db"))
    size = counter_file.stat().st_size
    for status in range(1000, 1600):  # upstream statuses no table knows: new series each
        forwarded(observer, status=status)
    assert counter_file.stat().st_size > size, "the file grew (prometheus-client mapped it anew)"
    forwarded(observer)  # an old series, through the mapping it was found in
    text = metrics.render().decode()
    assert metric(text, "payonce_upstream_calls_total", status="200") == 2
    assert metric(text, "payonce_upstream_calls_total", status="1599") == 1
    assert metric(text, "payonce_requests_total", outcome="forwarded", status_class="2xx") == 2
    assert metric(text, "payonce_requests_total", outcome="forwarded", status_class="5xx") == 600


def test_a_single_process_keeps_its_metrics_in_memory(shared: Path) -> None:
    Metrics(str(shared))
    metrics = Metrics()
    assert values.ValueClass is values.MutexValue
    observer = Observer(metrics, None, ManualClock())
    forwarded(observer)
    text = metrics.render().decode()
    assert metric(text, "payonce_requests_total", outcome="forwarded", status_class="2xx") == 1
    assert "payonce_requests_created" in text


def test_a_worker_starting_beside_a_half_made_file_of_another_starts(shared: Path) -> None:
    # Another worker has created its file but not yet written its header: reading the
    # directory then fails (struct.error). Starting must not read it; a scrape may.
    (shared / "counter_4242.db").write_bytes(b"")
    metrics = Metrics(str(shared))
    observer = Observer(metrics, None, ManualClock())
    forwarded(observer)
    (shared / "counter_4242.db").unlink()
    text = metrics.render().decode()
    assert metric(text, "payonce_requests_total", outcome="forwarded", status_class="2xx") == 1
