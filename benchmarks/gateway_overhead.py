"""What does payonce cost per request, compared with a plain reverse proxy?

Runs, in one go, against ``payonce sim --latency fixed:0`` (an upstream that answers
at once, so the proxies' own work is what is measured):

==================  ========================================================================
path                what is measured
==================  ========================================================================
direct              wrk straight to the simulator: the upstream's own ceiling
nginx               nginx ``proxy_pass`` to the simulator, upstream keepalive
nginx → static      the same nginx proxy in front of a second nginx that returns a canned
                    completion: nginx driven as hard as the load generator allows, its CPU
                    per request at (near) saturation; a reference row, not in the issue
payonce no key      ``payonce serve`` as a plain pass-through (nothing stored)
payonce first call  a fresh ``Idempotency-Key`` per request: SQLite claim, upstream call,
                    store the response
payonce replay      ``--replay-keys`` keys completed beforehand, then cycled: each request
                    is answered from SQLite; the simulator is never called
redis first call    the same first-call load on the Redis store (a private ``redis-server``
                    on a free port, pinned with the simulator and wrk), one worker, then
                    ``--workers 2``
redis replay        the same replay load on the Redis store, one worker, then two
sqlite workers      first call and replay on SQLite with ``--workers 2`` (only when asked:
                    ``--only sqlite-workers``)
==================  ========================================================================

Scenario groups (``--only``, comma-separated): ``direct``, ``nginx``, ``sqlite`` (the
payonce paths above on SQLite), ``redis`` (one and two workers) and ``sqlite-workers``;
all but ``sqlite-workers`` by default.

Method
------
* Real processes on free 127.0.0.1 ports. With two or more cores the process under test
  (nginx or the gateway) runs on core 1 (``taskset -c 1``); the simulator, wrk (and the
  static nginx) share core 0. The simulator is therefore the bottleneck of the paths that
  call it when the proxy is fast; the "core busy" columns say which side ran out of CPU.
* Load: wrk, ``--connections`` connections and ``--threads`` threads, a ``--warmup`` run
  that is thrown away, then the timed ``--duration`` run (whole seconds: wrk's unit).
  Requests are POSTs of a small chat completion with ``Authorization: Bearer sk-bench``.
  Keys come from a Lua ``request()``: a run nonce, the wrk thread id and a counter for
  first calls; a cycle over the pre-made keys for replays.
* CPU per request: utime + stime of the process under test (and its children: nginx's
  worker) from ``/proc/PID/stat`` before and after the timed run, divided by the requests
  wrk completed. This is the stable figure on shared machines; requests/s and latency
  move 15-30% between runs, so compare paths within one run, as ratios.
* Workers: a ``--workers 2`` gateway is not pinned (its workers may use every core, the
  load generator's included), and its CPU is the sum over the supervisor and its workers.
  A second table shows where the cores went: gateway, simulator, Redis, wrk (its user +
  system time, from ``RUSAGE_CHILDREN``) and "other" (whatever else the machine ran), each
  in cores, against all cores' busy time from ``/proc/stat``.
* Latency: p50/p99 at one connection (``wrk -c1``), ``--latency-duration`` s per path.
  Noisy: an order of magnitude only.
* The simulator's ledger is reset before each timed run and read after it: the upstream
  calls per request each path made (1 for a proxy, 0 for a replay).
* Any wrk error (socket error, timeout, status >= 400) flags the scenario in the output.
  Steal time, or another process using the core under test, adds a warning: the run was
  disturbed (other test suites on a shared machine) and its CPU figures are suspect.

Targets, payonce as a share of nginx on one gateway core: keyed first call (SQLite) >= 6%,
replay >= 10%, no-key pass-through >= 10%; Redis keyed first call >= 60% of SQLite's on
one worker (req/s, and CPU per request). Each nginx target is checked three ways: requests/s against
nginx's requests/s (the issue's wording; flattering while nginx waits for the simulator),
nginx's CPU per request over payonce's (what one core could serve), and the same against
nginx → static (nginx's cost when it is actually busy; the strictest). PASS/MISS is
printed for each; the exit status is 0 either way (1 only when the benchmark cannot run).

``--profile DIR`` adds, after the measured runs, py-spy recordings (``--native``, raw
collapsed stacks in DIR) of the gateway under the no-key, first-call and replay loads,
and prints self time by layer and by function and inclusive time of Python functions.
Those runs are separate from the timed ones, so sampling never touches the table.
py-spy is not a project dependency: ``.venv/bin/pip install py-spy``.

Usage::

    .venv/bin/python benchmarks/gateway_overhead.py                  # about 160 s
    .venv/bin/python benchmarks/gateway_overhead.py --quick          # smoke run, ~50 s
    .venv/bin/python benchmarks/gateway_overhead.py --only sqlite,redis   # about 110 s
    .venv/bin/python benchmarks/gateway_overhead.py --profile /tmp/payonce-profile  # +40 s
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

BODY = '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":16}'
AUTHORIZATION = "Bearer sk-bench"
CHAT_PATH = "/v1/chat/completions"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# Minimum share of nginx's throughput, per payonce path (the targets).
TARGETS = {"payonce-first": 0.06, "payonce-replay": 0.10, "payonce-nokey": 0.10}
# Minimum share of the SQLite figure (one worker) for the keyed first call on Redis.
REDIS_TARGET = 0.60
GROUPS = ("direct", "nginx", "sqlite", "redis", "sqlite-workers")
DEFAULT_GROUPS = ("direct", "nginx", "sqlite", "redis")


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Options:
    duration: int
    warmup: int
    connections: int
    threads: int
    latency_duration: int
    replay_keys: int
    pin: bool
    install: bool
    profile_dir: Path | None
    profile_rate: int
    tmp_root: Path | None
    only: frozenset[str] = frozenset(DEFAULT_GROUPS)


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        description="Measure payonce's overhead against nginx and a direct call.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--duration", type=int, default=10, help="seconds per timed run")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of discarded load")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="wrk threads")
    parser.add_argument(
        "--latency-duration",
        type=int,
        default=3,
        help="seconds of the 1-connection latency run per path (0 skips it)",
    )
    parser.add_argument("--replay-keys", type=int, default=100, help="keys cycled by replay")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 s per path, short warmup"
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin with taskset")
    parser.add_argument(
        "--no-install", action="store_true", help="never apt-get install nginx or wrk"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="also record py-spy profiles of the gateway (each payonce path) into DIR",
    )
    parser.add_argument("--profile-rate", type=int, default=250, help="py-spy samples/s")
    parser.add_argument(
        "--tmpdir", type=Path, default=None, help="where the SQLite file and configs go"
    )
    parser.add_argument(
        "--only",
        default=",".join(DEFAULT_GROUPS),
        help=f"scenario groups to run, comma-separated, from: {', '.join(GROUPS)}",
    )
    args = parser.parse_args(argv)
    only = frozenset(group.strip() for group in args.only.split(",") if group.strip())
    if not only or only - set(GROUPS):
        parser.error(f"--only: choose from {', '.join(GROUPS)}")
    duration, warmup, latency = args.duration, args.warmup, args.latency_duration
    if args.quick:
        duration, warmup, latency = 2, 1, min(latency, 1)
    return Options(
        duration=duration,
        warmup=warmup,
        connections=args.connections,
        threads=args.threads,
        latency_duration=latency,
        replay_keys=args.replay_keys,
        pin=not args.no_pin,
        install=not args.no_install,
        profile_dir=args.profile,
        profile_rate=args.profile_rate,
        tmp_root=args.tmpdir,
        only=only,
    )


# --------------------------------------------------------------------------- processes


def free_port() -> int:
    """A port the kernel considers free right now (bind to 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Pinning:
    """Which core each role runs on; ``None`` means no pinning."""

    under_test: int | None
    load: int | None

    @classmethod
    def for_machine(cls, enabled: bool) -> Pinning:
        if enabled and (os.cpu_count() or 1) >= 2 and shutil.which("taskset"):
            return cls(under_test=1, load=0)
        return cls(under_test=None, load=None)

    @staticmethod
    def wrap(core: int | None, command: Sequence[str]) -> list[str]:
        return ["taskset", "-c", str(core), *command] if core is not None else list(command)

    def describe(self) -> str:
        if self.under_test is None:
            return "no pinning"
        return (
            f"process under test on core {self.under_test} (taskset -c {self.under_test});"
            f" simulator and wrk on core {self.load}"
        )


@dataclass
class Service:
    """A child process we started, with its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
        if not self.alive():
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_service(
    name: str, command: Sequence[str], log_dir: Path, env: Mapping[str, str] | None = None
) -> Service:
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    return Service(name, process, log_path)


def _children_cpu_us() -> float:
    """User + system time of this script's finished children (each wrk run), in µs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1e6


def http_get_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(200 <= response.status < 300)
    except (OSError, urllib.error.URLError):
        return False


def wait_ready(service: Service, url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.alive():
            raise RuntimeError(f"{service.name} exited early:\n{service.log_tail()}")
        if http_get_ok(url):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{service.name} not ready at {url} after {timeout:.0f}s")


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (nginx: master and worker)."""
    pids, pending = [], [pid]
    while pending:
        current = pending.pop()
        pids.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):
                pending.extend(int(child) for child in (task / "children").read_text().split())
    return pids


def cpu_us(pid: int) -> float:
    """utime + stime of ``pid`` and its descendants, in microseconds."""
    ticks = 0
    for member in process_tree(pid):
        try:
            stat = Path(f"/proc/{member}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state is fields[0]
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14, 15)
    return ticks * 1e6 / CLOCK_TICKS


@dataclass(frozen=True)
class CoreTicks:
    """Clock ticks of one core since boot, from /proc/stat."""

    busy: int  # everything but idle, iowait and steal
    steal: int  # time the hypervisor gave to someone else
    total: int

    @classmethod
    def read(cls, core: int) -> CoreTicks:
        for line in Path("/proc/stat").read_text().splitlines():
            name, *values = line.split()
            if name == f"cpu{core}":
                user, nice, system, idle, iowait, irq, softirq, steal = map(int, values[:8])
                busy = user + nice + system + irq + softirq
                return cls(busy, steal, busy + steal + idle + iowait)
        return cls(0, 0, 0)

    def shares_since(self, before: CoreTicks) -> tuple[float, float]:
        """(busy, steal) as shares of the wall time between ``before`` and now."""
        total = self.total - before.total
        if total <= 0:
            return 0.0, 0.0
        return (self.busy - before.busy) / total, (self.steal - before.steal) / total


# --------------------------------------------------------------------------- tools


def find_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for directory in ("/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin"):
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def ensure_binary(name: str, packages: Sequence[str], install: bool) -> str | None:
    """Find ``name``; if missing, apt-get install the first package that works (as root)."""
    found = find_binary(name)
    if found or not install:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        print(f"# {name} is not installed and cannot be installed here (needs root and apt)")
        return None
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for attempt in ("no-update", "update"):
        if attempt == "update":
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=False)
        for package in packages:
            print(f"# installing {package} with apt-get ...", flush=True)
            done = subprocess.run(
                ["apt-get", "install", "-y", package], env=env, capture_output=True, check=False
            )
            if done.returncode == 0 and find_binary(name):
                return find_binary(name)
    print(f"# could not install {name} ({', '.join(packages)})")
    return None


def tool_version(command: Sequence[str]) -> str:
    with contextlib.suppress(OSError):
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        text = (done.stdout + done.stderr).strip().splitlines()
        if text:
            return text[0].strip()
    return "?"


def payonce_command() -> list[str]:
    script = Path(sys.executable).with_name("payonce")
    return [str(script)] if script.exists() else [sys.executable, "-m", "payonce"]


# --------------------------------------------------------------------------- wrk


@dataclass
class WrkResult:
    requests: int
    seconds: float
    connect_errors: int
    read_errors: int
    write_errors: int
    status_errors: int
    timeouts: int
    p50_us: float
    p99_us: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def errors(self) -> int:
        return sum(count for _, count in self._error_counts())

    def _error_counts(self) -> tuple[tuple[str, int], ...]:
        return (
            ("connect", self.connect_errors),
            ("read", self.read_errors),
            ("write", self.write_errors),
            ("status>=400", self.status_errors),
            ("timeout", self.timeouts),
        )

    def describe_errors(self) -> str:
        parts = [f"{name} {count}" for name, count in self._error_counts() if count]
        return ", ".join(parts) or "none"


_LUA_COMMON = """\
wrk.method = "POST"
wrk.body = '{body}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "{authorization}"

local next_thread = 1
function setup(thread)
  thread:set("tid", next_thread)
  next_thread = next_thread + 1
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("@@wrk %d %d %d %d %d %d %d %d %d\\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""

_LUA_FIRST_CALL = """
local sent = 0
function request()
  sent = sent + 1
  wrk.headers["Idempotency-Key"] = "{nonce}-" .. tid .. "-" .. sent
  return wrk.format()
end
"""

_LUA_REPLAY = """
local keys = {{{keys}}}
local index = tid or 0
function request()
  index = index % #keys + 1
  wrk.headers["Idempotency-Key"] = keys[index]
  return wrk.format()
end
"""


@dataclass(frozen=True)
class Load:
    """What wrk sends: no key, a fresh key per request, or a cycle over existing keys."""

    kind: str  # "nokey" | "first" | "replay"
    keys: tuple[str, ...] = ()

    def lua(self) -> str:
        script = _LUA_COMMON.format(body=BODY, authorization=AUTHORIZATION)
        if self.kind == "first":
            # A new nonce per wrk run, so warmup and timed runs never share a key.
            script += _LUA_FIRST_CALL.format(nonce="bench-" + secrets.token_hex(6))
        elif self.kind == "replay":
            script += _LUA_REPLAY.format(keys=", ".join(f'"{key}"' for key in self.keys))
        return script


def run_wrk(
    wrk: str,
    url: str,
    load: Load,
    *,
    seconds: int,
    connections: int,
    threads: int,
    core: int | None,
    workdir: Path,
) -> WrkResult:
    script = workdir / f"wrk-{load.kind}-{secrets.token_hex(3)}.lua"
    script.write_text(load.lua())
    command = Pinning.wrap(
        core,
        [
            wrk,
            f"-t{min(threads, connections)}",
            f"-c{connections}",
            f"-d{max(1, seconds)}s",
            "--timeout",
            "5s",
            "-s",
            str(script),
            url,
        ],
    )
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    match = re.search(r"^@@wrk ((?:\d+ ?){9})$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    values = [int(value) for value in match.group(1).split()]
    return WrkResult(
        requests=values[0],
        seconds=values[1] / 1e6,
        connect_errors=values[2],
        read_errors=values[3],
        write_errors=values[4],
        status_errors=values[5],
        timeouts=values[6],
        p50_us=values[7],
        p99_us=values[8],
    )


# --------------------------------------------------------------------------- simulator


def sim_calls(sim_url: str) -> int | None:
    """Requests the simulator received since the last reset (None if it cannot say)."""
    try:
        with urllib.request.urlopen(f"{sim_url}/_sim/ledger?entries=0", timeout=5) as response:
            return int(json.load(response)["requests"])
    except (OSError, ValueError, KeyError, urllib.error.URLError):
        return None


def reset_sim(sim_url: str) -> None:
    request = urllib.request.Request(f"{sim_url}/_sim/ledger", method="DELETE")
    with contextlib.suppress(OSError, urllib.error.URLError):
        urllib.request.urlopen(request, timeout=5).close()


def post_chat(url: str, key: str | None = None) -> tuple[int, str | None, bytes]:
    """POST the benchmark body; (status, Idempotent-Replayed header, body)."""
    headers = {"Content-Type": "application/json", "Authorization": AUTHORIZATION}
    if key is not None:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(url, data=BODY.encode(), headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
        return response.status, response.headers.get("Idempotent-Replayed"), body


def make_replay_keys(gateway_url: str, count: int) -> tuple[str, ...]:
    """Complete ``count`` keys with one request each, then check one replays."""
    nonce = secrets.token_hex(6)
    keys = tuple(f"replay-{nonce}-{index}" for index in range(count))
    for key in keys:
        status, replayed, _ = post_chat(gateway_url + CHAT_PATH, key)
        if status != 200 or replayed != "false":
            raise RuntimeError(f"priming key {key}: status {status}, replayed {replayed}")
    status, replayed, _ = post_chat(gateway_url + CHAT_PATH, keys[0])
    if status != 200 or replayed != "true":
        raise RuntimeError(f"replay check failed: status {status}, replayed {replayed}")
    return keys


# --------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Target:
    """One path under load: where wrk sends, and which process is the proxy under test."""

    name: str
    label: str
    url: str
    load: Load
    proxy: Service | None  # None for direct
    calls_sim: bool = True  # False for the static-upstream reference
    workers: int = 1  # gateway worker processes; more than one runs unpinned


@dataclass
class Measurement:
    name: str
    label: str
    result: WrkResult | None = None
    proxy_cpu_us: float | None = None  # per request
    proxy_busy: float | None = None  # share of one core
    sim_busy: float | None = None  # share of one core
    load_core_busy: float | None = None  # core 0: simulator + wrk (+ static upstream)
    redis_busy: float | None = None  # share of one core
    wrk_busy: float | None = None  # share of one core
    all_busy: float | None = None  # every core's busy time, in cores
    workers: int = 1
    upstream_calls: int | None = None
    latency: WrkResult | None = None
    skipped: str | None = None
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # the run may be disturbed

    @property
    def rps(self) -> float:
        return self.result.rps if self.result else 0.0

    @property
    def flagged(self) -> bool:
        return bool(self.errors)

    @property
    def other_busy(self) -> float | None:
        """Cores busy with work none of our processes did (another job on the machine)."""
        if self.all_busy is None:
            return None
        ours = (self.proxy_busy, self.sim_busy, self.redis_busy, self.wrk_busy)
        return self.all_busy - sum(share or 0.0 for share in ours)


class Bench:
    """Holds the shared pieces (wrk, simulator, pinning, temp dir) and runs targets."""

    def __init__(self, options: Options, wrk: str, workdir: Path, pinning: Pinning) -> None:
        self.options = options
        self.wrk = wrk
        self.workdir = workdir
        self.pinning = pinning
        self.sim: Service | None = None
        self.sim_url = ""
        self.redis: Service | None = None  # while the Redis scenarios run

    def start_sim(self) -> None:
        port = free_port()
        command = [*payonce_command(), "sim", "--latency", "fixed:0", "--port", str(port)]
        self.sim = start_service("sim", Pinning.wrap(self.pinning.load, command), self.workdir)
        self.sim_url = f"http://127.0.0.1:{port}"
        wait_ready(self.sim, f"{self.sim_url}/_sim/health")

    def wrk_run(self, target: Target, seconds: int, connections: int) -> WrkResult:
        return run_wrk(
            self.wrk,
            target.url + CHAT_PATH,
            target.load,
            seconds=seconds,
            connections=connections,
            threads=self.options.threads,
            core=self.pinning.load,
            workdir=self.workdir,
        )

    def measure(self, target: Target) -> Measurement:
        options = self.options
        assert self.sim is not None
        measurement = Measurement(target.name, target.label)
        print(f"# {target.label}: warmup {options.warmup:g}s ...", flush=True)
        if options.warmup > 0:
            self.wrk_run(target, options.warmup, options.connections)
        reset_sim(self.sim_url)
        proxy_pid = target.proxy.pid if target.proxy else None
        proxy_before = cpu_us(proxy_pid) if proxy_pid else 0.0
        sim_before = cpu_us(self.sim.pid)
        redis_before = cpu_us(self.redis.pid) if self.redis else 0.0
        wrk_before = _children_cpu_us()
        cores = range(os.cpu_count() or 1)
        ticks_before = [CoreTicks.read(core) for core in cores]
        started = time.monotonic()
        result = self.wrk_run(target, options.duration, options.connections)
        wall = time.monotonic() - started
        shares = [CoreTicks.read(core).shares_since(ticks_before[core]) for core in cores]
        wrk_after = _children_cpu_us()
        sim_after = cpu_us(self.sim.pid)
        redis_after = cpu_us(self.redis.pid) if self.redis else 0.0
        proxy_after = cpu_us(proxy_pid) if proxy_pid else 0.0
        measurement.result = result
        measurement.workers = target.workers
        measurement.wrk_busy = (wrk_after - wrk_before) / (wall * 1e6)
        measurement.all_busy = sum(busy for busy, _ in shares)
        if self.redis is not None:
            measurement.redis_busy = (redis_after - redis_before) / (wall * 1e6)
        if target.calls_sim:
            measurement.upstream_calls = sim_calls(self.sim_url)
            measurement.sim_busy = (sim_after - sim_before) / (wall * 1e6)
        if proxy_pid and result.requests:
            measurement.proxy_cpu_us = (proxy_after - proxy_before) / result.requests
            measurement.proxy_busy = (proxy_after - proxy_before) / (wall * 1e6)
        self._check_disturbance(measurement, shares)
        if result.errors:
            measurement.errors.append(f"errors: {result.describe_errors()}")
        print(
            f"#   {result.rps:,.0f} req/s, {result.requests} requests,"
            f" errors {result.describe_errors()}",
            flush=True,
        )
        if options.latency_duration > 0:
            measurement.latency = self.wrk_run(target, options.latency_duration, 1)
            if measurement.latency.errors:
                measurement.errors.append(
                    f"latency run errors: {measurement.latency.describe_errors()}"
                )
        return measurement

    def _check_disturbance(
        self, measurement: Measurement, shares: Sequence[tuple[float, float]]
    ) -> None:
        """Core 0's load; warn about steal time and strangers on the core under test."""
        steal = max(steal for _, steal in shares)
        if steal > 0.03:
            measurement.warnings.append(f"steal time up to {steal:.0%} of a core")
        if self.pinning.load is None or self.pinning.under_test is None:
            return
        measurement.load_core_busy = shares[self.pinning.load][0]
        if measurement.workers > 1:
            return  # an unpinned gateway: "other" in the cores table says who else ran
        strangers = shares[self.pinning.under_test][0] - (measurement.proxy_busy or 0.0)
        if strangers > 0.10:
            measurement.warnings.append(
                f"core {self.pinning.under_test} also {strangers:.0%} busy with other work"
            )


_NGINX_CONFIG = """\
daemon off;
worker_processes 1;
error_log {root}/error.log warn;
pid {root}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    keepalive_requests 1000000;
{http}
}}
"""

_NGINX_PROXY = """\
    upstream backend {{
        server 127.0.0.1:{upstream_port};
        keepalive 64;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}"""

# A canned chat completion, as the simulator answers: an upstream that costs next
# to nothing, so nginx-the-proxy can be driven harder than the simulator allows.
_NGINX_STATIC = """\
    server {{
        listen 127.0.0.1:{port};
        default_type application/json;
        location / {{
            return 200 '{body}';
        }}
    }}"""


@contextlib.contextmanager
def nginx(
    binary: str, bench: Bench, name: str, core: int | None, http: str, port: int
) -> Iterator[tuple[Service, str]]:
    """One nginx (master and one worker) with ``http`` as its ``http {}`` content."""
    root = bench.workdir / name
    root.mkdir(exist_ok=True)
    config = root / "nginx.conf"
    config.write_text(_NGINX_CONFIG.format(root=root, http=http))
    command = Pinning.wrap(core, [binary, "-c", str(config), "-p", f"{root}/"])
    service = start_service(name, command, bench.workdir)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(service, f"{url}/_sim/health")
        yield service, url
    finally:
        service.stop(signal.SIGQUIT)


def nginx_proxy(
    binary: str, bench: Bench, upstream_url: str, name: str = "nginx"
) -> contextlib.AbstractContextManager[tuple[Service, str]]:
    """nginx ``proxy_pass`` on the core under test, keepalive to ``upstream_url``."""
    port = free_port()
    upstream_port = upstream_url.rsplit(":", 1)[1]
    http = _NGINX_PROXY.format(upstream_port=upstream_port, port=port)
    return nginx(binary, bench, name, bench.pinning.under_test, http, port)


def nginx_static(
    binary: str, bench: Bench, body: str
) -> contextlib.AbstractContextManager[tuple[Service, str]]:
    """nginx answering every request with ``body``, on the load generator's core."""
    port = free_port()
    if any(char in body for char in "'\\$"):
        raise RuntimeError("the canned response cannot be quoted for nginx")
    http = _NGINX_STATIC.format(port=port, body=body)
    return nginx(binary, bench, "nginx-static", bench.pinning.load, http, port)


@contextlib.contextmanager
def payonce_gateway(
    bench: Bench, store: str | None = None, workers: int = 1, name: str = "gateway"
) -> Iterator[tuple[Service, str]]:
    """``payonce serve`` on the core under test; with ``workers`` > 1, unpinned."""
    port = free_port()
    command = [
        *payonce_command(),
        "serve",
        "--upstream",
        bench.sim_url,
        "--store",
        store or f"sqlite:///{bench.workdir}/bench.db",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--workers",
        str(workers),
    ]
    core = bench.pinning.under_test if workers == 1 else None
    service = start_service(name, Pinning.wrap(core, command), bench.workdir)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(service, f"{url}/_payonce/health")
        yield service, url
    finally:
        service.stop()


def redis_ping(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(64).startswith(b"+PONG")
    return False


@contextlib.contextmanager
def redis_server(bench: Bench, binary: str) -> Iterator[tuple[Service, str]]:
    """A private ``redis-server`` (no persistence) on a free port, on the load's core."""
    port = free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    command += ["--appendonly", "no", "--daemonize", "no", "--dir", str(bench.workdir)]
    service = start_service("redis", Pinning.wrap(bench.pinning.load, command), bench.workdir)
    try:
        deadline = time.monotonic() + 20
        while not redis_ping(port):
            if not service.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start:\n{service.log_tail()}")
            time.sleep(0.05)
        yield service, f"redis://127.0.0.1:{port}/0"
    finally:
        service.stop()


# --------------------------------------------------------------------------- profiling

# Where a sampled frame belongs, by a marker in its "function (file)" text. py-spy
# --native adds C frames: uvloop/libuv (loop.c, core.c, stream.c ...), httptools
# (parser.c, llhttp.c), CPython's _sqlite3 (cursor.c, connection.c) and libsqlite3.
_LAYERS = (
    ("payonce", ("payonce/",)),
    ("uvicorn+httptools", ("uvicorn/", "httptools", "parser.c", "llhttp.c")),
    ("aiohttp", ("aiohttp/", "yarl/", "multidict/", "_http_parser", "_multidict", "_quoting")),
    ("sqlite3", ("libsqlite3", "sqlite3/", "cursor.c", "connection.c", "_sqlite")),
    ("uvloop/libuv", ("uvloop", "loop.c", "core.c", "stream.c", "linux.c", "loop-watcher.c")),
    ("asyncio", ("asyncio/", "_asynciomodule")),
    ("json", ("json/", "_json.c")),
    ("hashlib", ("hashlib", "_hashopenssl", "libcrypto")),
)
# Frames on every stack (the command line and the event loop's entry): not informative.
_ENTRY_FRAMES = ("click/", "payonce/cli.py", "payonce/gateway/server.py", "runners.py", "<module>")


@dataclass
class Profile:
    name: str
    path: Path
    samples: int
    by_layer: list[tuple[str, int]]
    self_time: list[tuple[str, int]]
    inclusive: list[tuple[str, int]]


def _frame_name(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (to/file.py)``, without the line number."""
    match = re.match(r"^(.*) \((.*?)(?::\d+)?\)$", frame)
    if not match:
        return frame
    function, location = match.groups()
    if function.startswith("0x"):
        function = "?"
    return f"{function} ({'/'.join(Path(location).parts[-2:])})"


def _layer(frames: Sequence[str]) -> str:
    """The layer of the innermost frame that has one (a libc syscall goes to its caller's)."""
    for frame in reversed(frames):
        for layer, markers in _LAYERS:
            if any(marker in frame for marker in markers):
                return layer
    return "other (interpreter, libc)"


def summarize_profile(name: str, path: Path, top: int = 15) -> Profile:
    """Self time per function and per layer; inclusive time of Python functions."""
    leaf: Counter[str] = Counter()
    layers: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = [frame for frame in stack.split(";") if frame]
        count = int(count_text)
        total += count
        leaf[_frame_name(frames[-1])] += count
        layers[_layer(frames)] += count
        python = {
            _frame_name(frame)
            for frame in frames
            if ".py:" in frame and not any(entry in frame for entry in _ENTRY_FRAMES)
        }
        for function in python:
            inclusive[function] += count
    return Profile(
        name, path, total, layers.most_common(), leaf.most_common(top), inclusive.most_common(top)
    )


def record_profile(bench: Bench, target: Target, out_dir: Path) -> Profile | None:
    """py-spy (with native frames) on the gateway while wrk drives ``target``."""
    py_spy = find_binary("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        print("# py-spy not found (pip install py-spy); skipping the profile")
        return None
    assert target.proxy is not None
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / f"{target.name}.txt"
    seconds = max(2, bench.options.duration)
    record = [py_spy, "record", "--pid", str(target.proxy.pid), "--format", "raw"]
    record += ["--rate", str(bench.options.profile_rate), "--duration", str(seconds)]
    for native in (["--native"], []):  # --native needs unwind info; fall back without it
        command = Pinning.wrap(bench.pinning.load, [*record, "--output", str(output), *native])
        print(f"# profiling {target.label} for {seconds}s -> {output}", flush=True)
        recorder = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)  # let py-spy attach before the load starts
        bench.wrk_run(target, seconds + 1, bench.options.connections)
        _, stderr = recorder.communicate(timeout=60)
        if recorder.returncode == 0 and output.exists():
            return summarize_profile(target.name, output)
        print(f"# py-spy {' '.join(native)} failed: {stderr.decode(errors='replace').strip()}")
    return None


def print_profile(profile: Profile) -> None:
    share = 100 / max(1, profile.samples)
    print(f"\n### Profile: {profile.name} ({profile.samples} samples, {profile.path})\n")
    print("| self % by layer | layer |\n|---:|---|")
    for layer, count in profile.by_layer:
        print(f"| {count * share:.1f} | {layer} |")
    print("\n| self % | function (leaf frame) |\n|---:|---|")
    for function, count in profile.self_time:
        print(f"| {count * share:.1f} | `{function}` |")
    print("\n| inclusive % | Python function |\n|---:|---|")
    for function, count in profile.inclusive:
        print(f"| {count * share:.1f} | `{function}` |")


# --------------------------------------------------------------------------- report


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def machine_description() -> str:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"nproc {os.cpu_count()}, CPU {model}, {platform.system()} {platform.release()}"


def print_table(measurements: Sequence[Measurement], options: Options) -> None:
    print(
        f"\n| path | req/s ({options.connections} conn) | gateway CPU µs/req | gateway core busy"
        " | core 0 busy (sim+wrk) | sim CPU | upstream calls/req | p50 @1 conn* | p99 @1 conn*"
        " | errors, warnings |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for m in measurements:
        if m.skipped or m.result is None:
            print(f"| {m.label} | skipped: {m.skipped} | | | | | | | | |")
            continue
        calls = None
        if m.upstream_calls is not None and m.result.requests:
            calls = m.upstream_calls / m.result.requests
        notes = [f"**{error}**" for error in m.errors] + m.warnings
        p50, p99 = (m.latency.p50_us, m.latency.p99_us) if m.latency else (None, None)
        print(
            f"| {m.label} | {m.result.rps:,.0f} | {_fmt(m.proxy_cpu_us, ',.0f')}"
            f" | {_pct(m.proxy_busy)} | {_pct(m.load_core_busy)} | {_pct(m.sim_busy)}"
            f" | {_fmt(calls, '.2f')}"
            f" | {_fmt(p50, ',.0f', ' µs')} | {_fmt(p99, ',.0f', ' µs')}"
            f" | {'; '.join(notes) or '-'} |"
        )
    print(
        "\n\\* one connection, a few seconds per path: noisy (15-30% run to run, p99 far more);"
        " an order of magnitude only."
    )


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def _verdict(ratio: float | None, target: float, flagged: bool) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.1%} {'PASS' if ratio >= target else 'MISS'}{' (errors!)' if flagged else ''}"


def print_ratios(measurements: Sequence[Measurement]) -> None:
    """Each payonce path as a share of nginx: by req/s, and by CPU per request."""
    by_name = {m.name: m for m in measurements if m.result is not None}
    nginx, reference = by_name.get("nginx"), by_name.get("nginx-static")
    if nginx is None:
        print("\nNo nginx run: no ratios.")
        return
    print(
        "\n| payonce path | target | req/s ÷ nginx's req/s | nginx µs/req ÷ payonce µs/req"
        " | same, nginx → static upstream |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, target in TARGETS.items():
        m = by_name.get(name)
        if m is None:
            continue
        cpu = _cpu_ratio(nginx, m)
        ref_cpu = _cpu_ratio(reference, m) if reference else None
        print(
            f"| {m.label} | ≥ {target:.0%}"
            f" | {_verdict(m.rps / nginx.rps, target, m.flagged or nginx.flagged)}"
            f" | {_verdict(cpu, target, m.flagged or nginx.flagged)}"
            f" | {_verdict(ref_cpu, target, m.flagged or bool(reference and reference.flagged))}"
            " |"
        )


def _cpu_ratio(nginx: Measurement, payonce: Measurement) -> float | None:
    if nginx.proxy_cpu_us and payonce.proxy_cpu_us:
        return nginx.proxy_cpu_us / payonce.proxy_cpu_us
    return None


# --------------------------------------------------------------------------- main


def measure_nginx(bench: Bench, binary: str | None) -> list[Measurement]:
    """nginx in front of the simulator, then in front of a static upstream (its ceiling)."""
    label, static_label = "nginx proxy_pass", "nginx proxy_pass → static nginx (reference)"
    if binary is None:
        return [Measurement("nginx", label, skipped="nginx not available")]
    measurements = []
    try:
        with nginx_proxy(binary, bench, bench.sim_url) as (proxy, url):
            measurements.append(bench.measure(Target("nginx", label, url, Load("nokey"), proxy)))
        _, _, canned = post_chat(bench.sim_url + CHAT_PATH)
        with (
            nginx_static(binary, bench, canned.decode()) as (_, static_url),
            nginx_proxy(binary, bench, static_url, "nginx-ref") as (proxy, url),
        ):
            target = Target("nginx-static", static_label, url, Load("nokey"), proxy, False)
            measurements.append(bench.measure(target))
    except RuntimeError as exc:
        print(f"# nginx run failed: {exc}")
        if not measurements:
            measurements.append(Measurement("nginx", label, skipped=str(exc).splitlines()[0]))
    return measurements


def measure_payonce(bench: Bench) -> tuple[list[Measurement], list[Profile]]:
    """One gateway on SQLite: no key, keyed first calls, then replays of completed keys."""
    measurements, profiles = [], []
    with payonce_gateway(bench) as (gateway, url):
        nokey = Target("payonce-nokey", "payonce, no key", url, Load("nokey"), gateway)
        first = Target(
            "payonce-first", "payonce, keyed first call (SQLite)", url, Load("first"), gateway
        )
        measurements.append(bench.measure(nokey))
        measurements.append(bench.measure(first))
        keys = make_replay_keys(url, bench.options.replay_keys)
        replay = Target(
            "payonce-replay", "payonce, keyed replay (SQLite)", url, Load("replay", keys), gateway
        )
        measurements.append(bench.measure(replay))
        if bench.options.profile_dir is not None:
            for target in (nokey, first, replay):
                profile = record_profile(bench, target, bench.options.profile_dir)
                if profile is not None:
                    profiles.append(profile)
    return measurements, profiles


def measure_keyed(
    bench: Bench, store: str, store_label: str, workers: int, prefix: str
) -> list[Measurement]:
    """Keyed first calls, then replays of completed keys, through one gateway."""
    where = store_label if workers == 1 else f"{store_label}, {workers} workers"
    name = f"gateway-{prefix}-{workers}w"
    with payonce_gateway(bench, store, workers, name) as (gateway, url):
        first = Target(
            f"{prefix}-first-{workers}w",
            f"payonce, keyed first call ({where})",
            url,
            Load("first"),
            gateway,
            workers=workers,
        )
        measurements = [bench.measure(first)]
        keys = make_replay_keys(url, bench.options.replay_keys)
        replay = Target(
            f"{prefix}-replay-{workers}w",
            f"payonce, keyed replay ({where})",
            url,
            Load("replay", keys),
            gateway,
            workers=workers,
        )
        measurements.append(bench.measure(replay))
    return measurements


def measure_redis(bench: Bench, binary: str | None) -> list[Measurement]:
    """The keyed paths on a private Redis: one gateway worker, then two."""
    if binary is None:
        return [Measurement("redis-first-1w", "payonce on Redis", skipped="redis-server missing")]
    with redis_server(bench, binary) as (redis, url):
        bench.redis = redis
        try:
            return [
                *measure_keyed(bench, url, "Redis", 1, "redis"),
                *measure_keyed(bench, url, "Redis", 2, "redis"),
            ]
        finally:
            bench.redis = None


def print_cores(measurements: Sequence[Measurement]) -> None:
    """Where the cores went on the gateway paths: gateway, simulator, Redis, wrk, others."""
    rows = [m for m in measurements if m.result is not None and m.proxy_cpu_us is not None]
    rows = [m for m in rows if not m.name.startswith("nginx")]
    if not rows:
        return
    cores = os.cpu_count() or 1
    print(
        "\n| path | req/s | gateway CPU µs/req | gateway | simulator | Redis | wrk | other"
        f" | all {cores} cores busy |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in rows:
        print(
            f"| {m.label} | {m.rps:,.0f} | {_fmt(m.proxy_cpu_us, ',.0f')}"
            f" | {_cores(m.proxy_busy)} | {_cores(m.sim_busy)} | {_cores(m.redis_busy)}"
            f" | {_cores(m.wrk_busy)} | {_cores(m.other_busy)} | {_cores(m.all_busy)} |"
        )
    print("\nIn cores (1.00 = one core busy for the whole timed run).")


def _cores(share: float | None) -> str:
    return "-" if share is None else f"{share:.2f}"


def print_store_ratios(measurements: Sequence[Measurement]) -> None:
    """Redis against SQLite on one worker; two workers against one."""
    by_name = {m.name: m for m in measurements if m.result is not None}
    pairs = [
        ("Redis ÷ SQLite, keyed first call, 1 worker", "redis-first-1w", "payonce-first", True),
        ("Redis ÷ SQLite, keyed replay, 1 worker", "redis-replay-1w", "payonce-replay", False),
        ("2 workers ÷ 1, Redis keyed first call", "redis-first-2w", "redis-first-1w", False),
        ("2 workers ÷ 1, Redis keyed replay", "redis-replay-2w", "redis-replay-1w", False),
        ("2 workers ÷ 1, SQLite keyed first call", "sqlite-first-2w", "payonce-first", False),
        ("2 workers ÷ 1, SQLite keyed replay", "sqlite-replay-2w", "payonce-replay", False),
    ]
    lines = []
    for label, name, base, targeted in pairs:
        m, reference = by_name.get(name), by_name.get(base)
        if m is None or reference is None or not reference.rps:
            continue
        flagged = m.flagged or reference.flagged
        rps = m.rps / reference.rps
        cpu = None
        if m.proxy_cpu_us and reference.proxy_cpu_us:
            cpu = reference.proxy_cpu_us / m.proxy_cpu_us
        if targeted:
            cells = (_verdict(rps, REDIS_TARGET, flagged), _verdict(cpu, REDIS_TARGET, flagged))
            target = f"≥ {REDIS_TARGET:.0%}"
        else:
            cells = (f"{rps:.2f}x", "-" if cpu is None else f"{cpu:.2f}x")
            target = "-"
        lines.append(f"| {label} | {target} | {cells[0]} | {cells[1]} |")
    if lines:
        print("\n| comparison | target | req/s ratio | CPU per request (reference ÷ this) |")
        print("|---|---:|---:|---:|")
        print("\n".join(lines))


def print_header(options: Options, bench: Bench, nginx_binary: str | None) -> None:
    print(f"## payonce gateway overhead, {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}")
    print(f"# machine: {machine_description()}")
    python = os.path.relpath(sys.executable) if sys.executable.startswith(os.getcwd()) else "python"
    print(f"# command: {' '.join([python, *sys.argv])}")
    print(f"# pinning: {bench.pinning.describe()}")
    print(
        f"# load: wrk, {options.threads} thread(s), {options.connections} connections,"
        f" {options.warmup:g}s warmup + {options.duration:g}s per path;"
        f" latency at 1 connection for {options.latency_duration:g}s"
    )
    nginx_version = tool_version([nginx_binary, "-v"]) if nginx_binary else "no nginx"
    print(
        f"# versions: Python {platform.python_version()}, {tool_version([bench.wrk, '-v'])},"
        f" {nginx_version}"
    )
    print(f"# payonce: {git_revision()}")
    print(f"# SQLite file in {bench.workdir} ({filesystem_type(bench.workdir)})", flush=True)


def run(options: Options) -> int:
    wrk = ensure_binary("wrk", ["wrk"], options.install)
    if wrk is None:
        print("wrk is required (apt-get install -y wrk)", file=sys.stderr)
        return 1
    nginx_binary = None
    if "nginx" in options.only:
        nginx_binary = ensure_binary("nginx", ["nginx-light", "nginx"], options.install)
        if nginx_binary is None:
            print("# nginx unavailable: its rows and the ratios are skipped")
    redis_binary = None
    if "redis" in options.only:
        redis_binary = ensure_binary("redis-server", ["redis-server"], options.install)
    if options.tmp_root is not None:
        options.tmp_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="payonce-bench-", dir=options.tmp_root) as tmp:
        bench = Bench(options, wrk, Path(tmp), Pinning.for_machine(options.pin))
        print_header(options, bench, nginx_binary)
        measurements: list[Measurement] = []
        profiles: list[Profile] = []
        try:
            bench.start_sim()
            if "direct" in options.only:
                direct = Target("direct", "direct to sim", bench.sim_url, Load("nokey"), None)
                measurements.append(bench.measure(direct))
            if "nginx" in options.only:
                measurements.extend(measure_nginx(bench, nginx_binary))
            if "sqlite" in options.only:
                ours, profiles = measure_payonce(bench)
                measurements.extend(ours)
            if "sqlite-workers" in options.only:
                store = f"sqlite:///{bench.workdir}/bench-workers.db"
                measurements.extend(measure_keyed(bench, store, "SQLite", 2, "sqlite"))
            if "redis" in options.only:
                measurements.extend(measure_redis(bench, redis_binary))
        finally:
            if bench.sim is not None:
                bench.sim.stop()
        print_table(measurements, options)
        print_ratios(measurements)
        print_cores(measurements)
        print_store_ratios(measurements)
        for profile in profiles:
            print_profile(profile)
    return 0


def git_revision() -> str:
    """The commit the gateway under test was built from, and whether src/ had local edits."""
    root = Path(__file__).resolve().parent.parent
    with contextlib.suppress(OSError):
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if head:
            return f"git {head}" + (" + uncommitted changes in src/" if dirty else "")
    return "unknown revision"


def filesystem_type(path: Path) -> str:
    with contextlib.suppress(OSError):
        best, kind = "", "?"
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mount, fstype, *_ = line.split()
            if str(path).startswith(mount) and len(mount) > len(best):
                best, kind = mount, fstype
        return kind
    return "?"


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    try:
        return run(options)
    except RuntimeError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
