"""``payonce serve --workers N``: one set of metrics and one call log for all the workers.

Seen from outside only: scrapes of ``/_payonce/metrics`` (whichever worker accepts
them), the call log files, and ``/proc`` to tell which worker holds a connection.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import os
import signal
import stat
import statistics
import time
from collections import Counter
from pathlib import Path

import httpx2 as httpx
import orjson
import pytest

from tests.gateway.conftest import GatewayFactory, Sim, chat
from tests.support.exposition import metric
from tests.support.processes import Process
from tests.support.workers import Connection, workers_of

FORWARDED_2XX = {"outcome": "forwarded", "status_class": "2xx"}


def scrape(gateway: Process) -> str:
    """One scrape on a new connection: any worker may answer it."""
    return httpx.get(gateway.url + "/_payonce/metrics", timeout=10).text


def wait_until(condition: object, what: str, timeout: float = 20.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def keyed_requests(gateway: Process, prefix: str, count: int) -> list[int]:
    """``count`` keyed first calls, each on a new connection; the worker that served each."""
    served: list[int] = []
    workers = workers_of(gateway.popen.pid) or [gateway.popen.pid]
    for index in range(count):
        connection = Connection(gateway.url)
        connection.send_chat(f"{prefix}-{index}")
        assert connection.answer() == 200
        pid = connection.holder(workers)
        assert pid is not None
        served.append(pid)
        connection.close()
    return served


def assert_every_scrape_counts(gateway: Process, forwarded: int, scrapes: int = 12) -> None:
    """Every scrape, whichever worker answers it, shows the totals of all the workers."""
    # A request is counted when its response is finished: a scrape that raced the
    # last response by microseconds may miss it, so wait for the first full one.
    wait_until(
        lambda: metric(scrape(gateway), "payonce_requests_total", **FORWARDED_2XX) >= forwarded,
        f"a scrape to count {forwarded} forwarded requests",
    )
    for _ in range(scrapes):
        text = scrape(gateway)
        assert metric(text, "payonce_requests_total", **FORWARDED_2XX) == forwarded
        assert metric(text, "payonce_upstream_calls_total", status="200") == forwarded
        assert metric(text, "payonce_upstream_latency_seconds_count") == forwarded
        assert metric(text, "payonce_gateway_overhead_seconds_count") == forwarded
        assert metric(text, "payonce_upstream_latency_seconds_bucket", le="+Inf") == forwarded
        assert metric(text, "payonce_tokens_total", kind="spent", direction="input") > 0
        assert metric(text, "payonce_cost_usd_total", model="gpt-4o-mini") > 0
        assert metric(text, "payonce_in_flight_requests") == 0
        assert metric(text, "payonce_upstream_in_flight_calls") == 0


def test_every_scrape_of_three_workers_counts_every_request(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--workers", "3")
    served = keyed_requests(gateway, "spread", 60)
    assert len(set(served)) >= 2, f"the requests all landed on one worker: {Counter(served)}"
    assert_every_scrape_counts(gateway, 60)
    # The same figures as the provider's ledger, and the cost is the sum of the workers'.
    text = scrape(gateway)
    assert fresh_sim.billed() == 60
    cost = metric(text, "payonce_cost_usd_total", model="gpt-4o-mini")
    single = cost / 60
    assert single > 0
    for _ in range(5):
        assert metric(scrape(gateway), "payonce_cost_usd_total", model="gpt-4o-mini") == cost


def test_a_killed_worker_keeps_its_counts_and_leaves_no_requests_in_flight(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--workers", "3")
    supervisor = gateway.popen.pid
    before = keyed_requests(gateway, "before", 30)
    # Slow requests on their own connections, until one is held by a worker that
    # already served some of the first 30: that worker is killed while it holds it.
    slow: list[tuple[Connection, int]] = []
    victim = None
    for index in range(12):
        connection = Connection(gateway.url)
        connection.send_chat(f"slow-{index}", {"X-Sim-Delay-Ms": "3000"})
        wait_until(lambda c=connection: c.holder(workers_of(supervisor)) is not None, "accept")
        pid = connection.holder(workers_of(supervisor))
        assert pid is not None
        slow.append((connection, pid))
        if pid in before:
            victim = pid
            break
    assert victim is not None, "no worker both served requests and holds a slow one"
    in_flight = len(slow)
    wait_until(
        lambda: metric(scrape(gateway), "payonce_in_flight_requests") == in_flight,
        f"{in_flight} requests in flight, summed over the workers",
    )
    assert metric(scrape(gateway), "payonce_upstream_in_flight_calls") == in_flight
    os.kill(victim, signal.SIGKILL)
    wait_until(
        lambda: len(workers_of(supervisor)) == 3 and victim not in workers_of(supervisor),
        "the supervisor to restart the killed worker",
    )
    answered = 0
    for connection, pid in slow:
        if pid == victim:
            with pytest.raises((OSError, http.client.HTTPException)):
                connection.answer()
        else:
            assert connection.answer() == 200
            answered += 1
        connection.close()
    after = keyed_requests(gateway, "after", 30)
    assert victim not in after
    # The killed worker's share of the first 30 is still counted, once.
    assert_every_scrape_counts(gateway, len(before) + answered + len(after))


def metrics_directories(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("payonce-metrics-*"))


def test_the_supervisor_keeps_the_shared_metrics_in_a_private_directory_it_removes(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    # A directory the operator set is not the gateway's: the supervisor uses its own.
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(theirs))
    gateway = start_gateway("--workers", "2")
    keyed_requests(gateway, "private", 4)
    assert_every_scrape_counts(gateway, 4, scrapes=4)
    (directory,) = metrics_directories(tmp)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert list(theirs.iterdir()) == []
    assert gateway.stop() == 0
    assert metrics_directories(tmp) == []


def test_a_single_process_gateway_keeps_its_metrics_in_memory(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(theirs))
    gateway = start_gateway()
    keyed_requests(gateway, "single", 3)
    text = scrape(gateway)
    assert metric(text, "payonce_requests_total", **FORWARDED_2XX) == 3
    # prometheus-client's in-memory registry, as before: _created series, no files.
    assert metric(text, "payonce_requests_created", **FORWARDED_2XX) > 0
    assert metrics_directories(tmp) == [] and list(theirs.iterdir()) == []


def test_metrics_off_with_workers_make_no_directory(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    gateway = start_gateway("--workers", "2", "--no-metrics")
    keyed_requests(gateway, "off", 2)
    assert httpx.get(gateway.url + "/_payonce/metrics", timeout=10).status_code == 404
    assert metrics_directories(tmp) == []


def read_call_log(path: Path) -> list[dict[str, object]]:
    """Every line of the call log and its rotated files, each parsed (so each whole)."""
    lines: list[dict[str, object]] = []
    for file in path.parent.glob(path.name + "*"):
        lines.extend(orjson.loads(line) for line in file.read_bytes().splitlines())
    return lines


def _logged_keys(path: Path) -> set[str]:
    """The keys of the whole lines written so far (one may be half written)."""
    keys: set[str] = set()
    for file in path.parent.glob(path.name + "*"):
        for line in file.read_bytes().split(b"\n")[:-1]:
            keys.add(str(orjson.loads(line)["key"]))
    return keys


def test_three_workers_under_load_log_each_request_once_through_rotations(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    log_path = tmp_path / "calls.jsonl"
    limit = 64 * 1024
    gateway = start_gateway(
        "--workers", "3",
        "--call-log", str(log_path),
        "--call-log-max-bytes", str(limit),
        "--call-log-backups", "50",
    )  # fmt: skip
    keys = [f"load-{lane}-{index}" for lane in range(8) for index in range(50)]

    def lane(lane: int) -> list[int]:
        return [chat(gateway.url, key).status_code for key in keys[lane * 50 : lane * 50 + 50]]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = [status for answers in pool.map(lane, range(8)) for status in answers]
    assert statuses == [200] * len(keys)
    assert gateway.stop() == 0
    files = sorted(log_path.parent.glob(log_path.name + "*"))
    assert len(files) >= 3, f"two rotations or more: {[file.name for file in files]}"
    # One writer: each file rotated once, when the next whole line would not fit.
    assert all(file.stat().st_size <= limit for file in files)
    assert all(file.stat().st_size > limit - 4096 for file in files if file != log_path)
    lines = read_call_log(log_path)
    assert Counter(str(line["key"]) for line in lines) == Counter(keys)
    assert len({line["request_id"] for line in lines}) == len(keys)
    assert {line["outcome"] for line in lines} == {"forwarded"}


def test_a_stalled_call_log_writer_never_blocks_a_worker(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    log_path = tmp_path / "calls.jsonl"
    gateway = start_gateway("--workers", "2", "--call-log", str(log_path))
    supervisor = gateway.popen.pid
    healthy = [timed_chat(gateway, f"warm-{index}")[0] for index in range(20)]
    os.kill(supervisor, signal.SIGSTOP)  # the one writer reads nothing any more
    try:
        served: dict[str, int] = {}
        stalled: list[float] = []
        for index in range(500):
            elapsed, pid = timed_chat(gateway, f"stalled-{index}")
            served[f"stalled-{index}"] = pid
            stalled.append(elapsed)
            if index == 250:
                time.sleep(1.2)  # a flush meets a full pipe: the rest waits in the worker
    finally:
        os.kill(supervisor, signal.SIGCONT)
    print(
        f"\nlatency while the writer is stalled: median {statistics.median(stalled) * 1000:.1f} ms,"
        f" max {max(stalled) * 1000:.1f} ms; healthy median {statistics.median(healthy) * 1000:.1f}"
        f" ms, max {max(healthy) * 1000:.1f} ms"
    )
    assert max(stalled) < 2.0
    assert gateway.stop() == 0
    lines = read_call_log(log_path)
    keys = Counter(str(line["key"]) for line in lines)
    assert all(keys[key] == 1 for key in served) and len(keys) == len(served) + 20
    # More than a pipe's worth (64 KiB) went through one worker while nothing was read.
    size = {str(line["key"]): len(orjson.dumps(line)) + 1 for line in lines}
    per_worker = Counter[int]()
    for key, pid in served.items():
        per_worker[pid] += size[key]
    assert max(per_worker.values()) > 2 * 65536, per_worker


def timed_chat(gateway: Process, key: str) -> tuple[float, int]:
    """One keyed first call on a new connection: its latency and the worker that served it."""
    workers = workers_of(gateway.popen.pid)
    started = time.perf_counter()
    connection = Connection(gateway.url, timeout=10)
    connection.send_chat(key)
    assert connection.answer() == 200
    elapsed = time.perf_counter() - started
    pid = connection.holder(workers)
    connection.close()
    assert pid is not None
    return elapsed, pid


def test_lines_handed_over_outlive_a_worker_killed_with_sigkill(
    start_gateway: GatewayFactory, fresh_sim: Sim, tmp_path: Path
) -> None:
    log_path = tmp_path / "calls.jsonl"
    gateway = start_gateway("--workers", "2", "--call-log", str(log_path))
    supervisor = gateway.popen.pid
    before = {f"before-{index}": timed_chat(gateway, f"before-{index}")[1] for index in range(30)}
    # Handed over (once a second) and written by the supervisor: the lines are its now.
    wait_until(lambda: set(before) <= _logged_keys(log_path), "the lines in the supervisor's file")
    victim = Counter(before.values()).most_common(1)[0][0]
    os.kill(victim, signal.SIGKILL)
    wait_until(
        lambda: len(workers_of(supervisor)) == 2 and victim not in workers_of(supervisor),
        "the supervisor to restart the killed worker",
    )
    after = [f"after-{index}" for index in range(10)]
    for key in after:
        timed_chat(gateway, key)
    assert gateway.stop() == 0  # the others hand over the rest at shutdown
    keys = Counter(str(line["key"]) for line in read_call_log(log_path))
    assert keys == Counter([*before, *after])


def test_workers_write_the_call_log_to_stdout_through_the_supervisor(
    start_gateway: GatewayFactory, fresh_sim: Sim
) -> None:
    gateway = start_gateway("--workers", "2", "--call-log", "-")
    keys = [f"stdout-{index}" for index in range(20)]
    for key in keys:
        timed_chat(gateway, key)
    assert gateway.stop() == 0
    lines = [line for line in gateway.log.read_bytes().splitlines() if line.startswith(b"{")]
    assert Counter(str(orjson.loads(line)["key"]) for line in lines) == Counter(keys)
