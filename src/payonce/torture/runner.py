"""One torture run end to end, and the shrinking of a failing one.

A run starts its cluster, learns the answer each prompt gets straight from the
simulator, sends the plan's calls while the nemesis plays its faults, undoes
every fault, waits for leases to lapse, gathers the history and checks it.
Shrinking runs smaller plans (halves of the calls, then single faults and
calls dropped) while the same invariant still breaks, within a time budget.
"""

from __future__ import annotations

import concurrent.futures
import csv
import http.client
import logging
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from payonce.torture.checks import History, Violation, check, read_answer
from payonce.torture.cluster import Cluster
from payonce.torture.driver import CREDENTIAL, PATHS, body_of, headers_of, run_calls
from payonce.torture.nemesis import play_faults
from payonce.torture.plan import PROMPTS, Call, Plan

__all__ = ["RunResult", "run", "shrink"]

log = logging.getLogger("payonce.torture")


@dataclass
class RunResult:
    """A run's verdict: what broke, what a fault explained, and where its files are."""

    plan: Plan
    violations: list[Violation]
    excused: list[str]
    calls: int
    billed: int
    folder: Path | None

    @property
    def ok(self) -> bool:
        return not self.violations


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _expected(cluster: Cluster) -> dict[tuple[str, int], str]:
    """The text each (api, prompt) gets from the simulator, asked directly."""
    texts: dict[tuple[str, int], str] = {}
    port = cluster.sim.port
    for api in ("chat", "messages"):  # embeddings: checked by their count
        for prompt in range(len(PROMPTS)):
            call = Call(number=-1, at=0, gateway=0, key=None, api=api, prompt=prompt)
            path = PATHS[api]
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request("POST", path, body_of(call), headers_of(call))
                body = connection.getresponse().read()
            finally:
                connection.close()
            answer = read_answer(api, False, body)
            if answer is None:
                raise RuntimeError(f"the simulator gave no answer to {api} prompt {prompt}")
            texts[(api, prompt)] = answer.text
    # Those were billed too: start the count from nothing.
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("DELETE", "/_sim/ledger")
        connection.getresponse().read()
    finally:
        connection.close()
    return texts


def _statuses(cluster: Cluster, keys: set[str], lease: float) -> dict[str, dict[str, Any]]:
    """Each key's status on the first gateway, once no lease can still be live."""
    port = cluster.gateways[0].port
    auth = {"Authorization": f"Bearer {CREDENTIAL}"}
    deadline = time.monotonic() + max(10.0, 5 * lease)
    statuses: dict[str, dict[str, Any]] = {}
    pending = set(keys)
    while pending:
        for key in sorted(pending):
            status, body = _get(port, f"/_payonce/requests/{urllib.parse.quote(key)}", auth)
            document = orjson.loads(body) if body else {}
            statuses[key] = document if isinstance(document, dict) else {}
            if status != 200 or statuses[key].get("state") != "in_progress":
                pending.discard(key)
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    return statuses


def _replays(cluster: Cluster, keys: set[str]) -> dict[int, dict[str, int]]:
    """Each key's ``replays`` as each gateway's status says, once every gateway has
    written its counts (once a second) to the store. A gateway adds the counts it
    has not written yet: asking every one shows counts that never reach the store."""
    time.sleep(1.5)
    auth = {"Authorization": f"Bearer {CREDENTIAL}"}
    views: dict[int, dict[str, int]] = {}
    for number, gateway in enumerate(cluster.gateways):
        counts = views[number] = {}
        for key in sorted(keys):
            path = f"/_payonce/requests/{urllib.parse.quote(key)}"
            status, body = _get(gateway.port, path, auth)
            document = orjson.loads(body) if status == 200 and body else {}
            if isinstance(document, dict) and isinstance(document.get("replays"), int):
                counts[key] = document["replays"]
    return views


def _request_metrics(port: int) -> dict[tuple[str, str], float]:
    """payonce_requests_total of one gateway, by (outcome, status class), nonzero only."""
    status, body = _get(port, "/_payonce/metrics")
    if status != 200:
        raise RuntimeError(f"GET /_payonce/metrics on port {port} answered {status}")
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == "payonce_requests_total" and sample.value:
                labels = sample.labels
                counts[(labels["outcome"], labels["status_class"])] = sample.value
    return counts


def _settled_metrics(cluster: Cluster) -> dict[int, dict[tuple[str, str], float]]:
    """The request counters of every gateway that never restarted, once they stop moving.

    A keyed stream whose client left is counted when its run ends, which may be
    a moment after the last client request returned.
    """
    ports = {n: g.port for n, g in enumerate(cluster.gateways) if g.starts == 1}
    before = {n: _request_metrics(port) for n, port in ports.items()}
    for _ in range(20):
        time.sleep(0.5)
        now = {n: _request_metrics(port) for n, port in ports.items()}
        if now == before:
            break
        before = now
    return before


def _reconcile(folder: Path, ledger: Path) -> dict[str, Any] | None:
    """``payonce reconcile --json -`` of the run's call logs and ledger, as a user runs it."""
    calls = sorted(str(path) for path in folder.glob("calls*.jsonl*"))
    if not calls:
        return None
    command = [sys.executable, "-m", "payonce", "reconcile", "--calls", *calls]
    # The ledger file also holds the answers learnt before the run (_expected, the
    # user of call -1), which the simulator's own ledger forgot when it was reset.
    bill = folder / "bill.csv"
    with ledger.open(newline="") as source, bill.open("w", newline="") as target:
        rows = csv.DictReader(source)
        writer = csv.DictWriter(target, rows.fieldnames or [])
        writer.writeheader()
        writer.writerows(row for row in rows if row.get("user") != "unkeyed--1")
    command += ["--bill", str(bill), "--json", "-"]
    done = subprocess.run(command, capture_output=True, cwd=folder, timeout=300, check=False)
    if done.returncode == 2 and b"pip install" in done.stderr:
        log.warning("reconcile-tells-the-truth not checked: %s", done.stderr.decode().strip())
        return None
    if done.returncode not in (0, 1):  # 1: an alert fired, the document is still there
        raise RuntimeError(f"payonce reconcile failed ({done.returncode}): {done.stderr.decode()}")
    document = orjson.loads(done.stdout)
    return document if isinstance(document, dict) else None


def _call_log(folder: Path, pattern: str = "calls*.jsonl*") -> list[dict[str, Any]]:
    lines = []
    for path in sorted(folder.glob(pattern)):
        for raw in path.read_bytes().splitlines():
            if raw.strip():
                lines.append(orjson.loads(raw))
    return lines


def run(plan: Plan, *, keep: Path | None = None, gateway_src: Path | None = None) -> RunResult:
    """Run ``plan`` on fresh processes; its files go to ``keep`` (else a temporary folder,
    removed unless the run failed). ``gateway_src``: the gateways' checkout."""
    folder = keep or Path(tempfile.mkdtemp(prefix=f"payonce-torture-{plan.seed}-"))
    folder.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(
        folder,
        store=plan.store,
        gateways=plan.gateways,
        lease=plan.lease,
        ttl=plan.ttl,
        gateway_src=gateway_src,
    )
    try:
        cluster.start()
        expected = _expected(cluster)
        stop = threading.Event()
        started = time.monotonic()
        ports = [gateway.port for gateway in cluster.gateways]
        with concurrent.futures.ThreadPoolExecutor(1) as nemesis:
            played_future = nemesis.submit(play_faults, plan, cluster, started, stop)
            try:
                observations = run_calls(plan, ports, started, stop)
            finally:
                stop.set()
            played = played_future.result()
        cluster.release_store()
        keys = {call.key for call in plan.calls if call.key is not None}
        statuses = _statuses(cluster, keys, plan.lease)
        rss = {gateway.name: gateway.rss_bytes() for gateway in cluster.gateways}
        _, ledger_body = _get(cluster.sim.port, "/_sim/ledger?entries=1")
        ledger = orjson.loads(ledger_body).get("entries", [])
        killed = frozenset(i for i, g in enumerate(cluster.gateways) if g.killed)
        metrics = _settled_metrics(cluster)
        replays = _replays(cluster, keys)
    finally:
        cluster.stop()  # its call logs are written whole at shutdown
    history = History(
        observations=observations,
        played=played,
        ledger=ledger,
        call_log=_call_log(folder),
        statuses=statuses,
        expected=expected,
        rss=rss,
        killed_gateways=killed,
        gateway_lines={n: _call_log(folder, f"calls{n}.jsonl*") for n in metrics},
        request_metrics=metrics,
    )
    history.reconciled = _reconcile(folder, cluster.ledger)
    history.store_marks = cluster.store_marks()
    history.store = plan.store
    history.replays = replays
    history.ttl = plan.ttl
    violations = check(history, lease=plan.lease)
    _keep_bodies(folder, observations, violations)
    result = RunResult(plan, violations, history.excused, len(observations), len(ledger), folder)
    if result.ok and keep is None:
        shutil.rmtree(folder, ignore_errors=True)
        result.folder = None
    return result


def _keep_bodies(folder: Path, observations: list[Any], violations: list[Violation]) -> None:
    """What the clients of the calls a violation names received, as files to read."""
    by_number = {observation.call.number: observation for observation in observations}
    for violation in violations:
        for number in violation.calls:
            observation = by_number.get(number)
            if observation is not None:
                (folder / f"call-{number}.body").write_bytes(observation.body)
                (folder / f"call-{number}.txt").write_text(f"{observation!r}"[:4000])


def shrink(result: RunResult, *, budget: float, gateway_src: Path | None = None) -> RunResult:
    """A smaller plan that still breaks the first invariant ``result`` broke.

    Halves of the calls first (a key's calls go together), then each fault, then
    each key, for at most ``budget`` seconds; the smallest failing run is returned.
    """
    if result.ok:
        return result
    invariant = result.violations[0].invariant
    deadline = time.monotonic() + budget
    best = result

    def still_fails(plan: Plan) -> bool:
        nonlocal best
        if time.monotonic() > deadline or not plan.calls:
            return False
        attempt = run(plan, gateway_src=gateway_src)
        if any(v.invariant == invariant for v in attempt.violations):
            if best.folder is not None and best is not result:
                shutil.rmtree(best.folder, ignore_errors=True)
            best = attempt
            return True
        return False

    keys = sorted({call.key or f"#{call.number}" for call in best.plan.calls})
    while len(keys) > 1 and time.monotonic() < deadline:
        half = set(keys[: len(keys) // 2])
        for part in (half, set(keys) - half):
            plan = _only(best.plan, part)
            if still_fails(plan):
                keys = sorted(part)
                break
        else:
            break
    for fault in best.plan.faults:
        if time.monotonic() > deadline:
            break
        still_fails(best.plan.without(frozenset(), frozenset({fault.number})))
    for key in sorted({call.key or f"#{call.number}" for call in best.plan.calls}):
        current = {call.key or f"#{call.number}" for call in best.plan.calls}
        if time.monotonic() > deadline:
            break
        if key in current and len(current) > 1:
            still_fails(_only(best.plan, current - {key}))
    return best


def _only(plan: Plan, keys: set[str]) -> Plan:
    calls = tuple(c for c in plan.calls if (c.key or f"#{c.number}") in keys)
    return replace(plan, calls=calls)
