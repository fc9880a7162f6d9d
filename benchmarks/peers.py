"""payonce and its peers: the same workloads through each system, on this machine, in one run.

Systems (``--systems``, comma-separated; all by default):

==============  ==========================================================================
direct          straight to ``payonce sim`` (the baseline; its row is the simulator's cost)
nginx           Debian's nginx, ``proxy_pass`` with upstream keepalive and
                ``proxy_buffering off`` (the floor); installed with apt when missing
python-relay    benchmarks/relay_floor.py: a TCP relay on uvloop, bytes untouched (the floor
                of any Python gateway's cost per event); workload 5 only
python-http-relay
                the same with ``--http``: responses parsed by httptools and each body
                chunk framed again (the floor of a Python HTTP proxy); workload 5 only
litellm         the LiteLLM proxy at the version pinned by tests/support/litellm.py, in
                its own throwaway virtualenv (built on first use, then reused), config
                only, one ``openai/`` deployment per simulator, LiteLLM's defaults
litellm-cache   the same, with its response cache on (``cache: true``, in memory); only
                in the incident (its cache would answer the throughput load's identical
                requests)
payonce-sqlite  ``payonce serve`` on SQLite, one worker
payonce-redis   ``payonce serve`` on Redis (a private ``redis-server``), one worker
payonce-postgres
                ``payonce serve`` on PostgreSQL (a private server: Debian's
                ``postgresql``, ``initdb`` into the run's folder, its durable defaults:
                ``fsync`` and ``synchronous_commit`` on), one worker
payonce-postgres-2x
                two ``payonce serve`` on that PostgreSQL behind one port (nginx,
                round robin): workload 2 only, the issue 32 figure
==============  ==========================================================================

The store's own CPU (redis-server's, PostgreSQL's backends') is counted beside the
gateway's: ``store_cpu_us`` and ``cpu_us_with_store`` in workload 1,
``store_cpu_us_per_call`` in workload 4, ``cpu_us_per_event_with_store`` in workload 5.

``--baseline-src DIR`` adds ``payonce-sqlite-baseline`` (and ``payonce-redis-baseline``
when Redis runs): the same system with the payonce sources in ``DIR/src`` (a checkout of
an earlier commit, ``git worktree add DIR REV``) ahead of this one's on ``PYTHONPATH``, so
a change is measured against what it replaced in the same run, interleaved round by round.

Workloads (``--only``, comma-separated: workload1 ... workload5):

1. **Throughput and CPU per request** at zero upstream latency: wrk, ``--connections``
   connections, one thread, on core 0 with the simulator; the process under test alone on
   core 1. Loads: pass-through (no key), keyed first call (a fresh ``Idempotency-Key``
   per request), replay (keys completed beforehand, cycled). nginx and LiteLLM get the
   keyed load (they forward the header). CPU per request = utime + stime of the process
   under test and its children (``/proc/PID/stat``) over the timed run / requests.
2. **The incident**: ``--incident-requests`` business requests, the official openai SDK
   with its default retries (2) and the demo's 10 s timeout, its own key sent
   (``_idempotency_header``; each payonce system once more with no key sent at all,
   its retries matched by ``x-stainless-retry-count``), ``--incident-concurrency`` (50)
   at once, against a simulator of its own with the demo's latency
   ``lognormal:p50=4s,p99=30s`` and 1% 500s. Every duration is multiplied by
   ``--time-scale`` (0.1, the demo's: p50 0.4 s, p99 3 s, timeout 1 s). Billed
   generations per business request, from the simulator's ledger once nothing is
   generating and no request came for a while.
3. **Concurrent streams**: ``--streams`` streams at once (first token after 100 ms, then
   20 tokens 50 ms apart). Time to first byte and total time, p50 and p99, as added to
   direct's in the same round; peak RSS of the process under test.
4. **Concurrency at LLM scale**: ``--calls`` keyed calls that each take ``--call-seconds``
   upstream (half streams, one event a second; half whole responses), started at
   ``--call-rate`` per second so every one is in flight at once, on one worker. Every one
   answered? RSS of the gateway per call in flight, added p99 time to first byte. The
   load generator is two asyncio processes; file-descriptor limits are raised to the hard
   limit for every process started here.
5. **Streams at token rate** (``benchmarks/peers_streams.py``): 200 streams x 50 events/s
   and 1,000 x 20 events/s, ``--stream-events`` events each, through direct, nginx and
   each payonce store unkeyed and keyed: CPU per event of the process under test (and
   redis-server's) against nginx's in the same round, and the extra p99 gap between
   events against direct's.

Rounds: workloads 1 and 3 run every system once per round, ``--rounds`` rounds (3), and
report the median with the min-max; workload 2 runs ``--incident-rounds`` rounds (the
same by default; LiteLLM's take minutes each on a shared core); workload 4 interleaves
its systems in ``--rounds`` rounds too.
Output: a table, ``--json`` and ``--svg`` (a chart of
CPU per request and billed generations per business request). The load average is
printed before and after each workload: the machine is shared.

Usage::

    .venv/bin/python benchmarks/peers.py                       # everything, ~20 min
    .venv/bin/python benchmarks/peers.py --quick               # every workload, small
    .venv/bin/python benchmarks/peers.py --only workload1 --systems nginx,payonce-sqlite
    .venv/bin/python benchmarks/peers.py --only workload1 --systems payonce-sqlite \
        --baseline-src /tmp/payonce-before                   # a change against its base
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime as dt
import functools
import json
import os
import platform
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

from tests.support import litellm as litellm_support  # noqa: E402

import gateway_overhead as go  # noqa: E402
import peers_load  # noqa: E402
import peers_report  # noqa: E402
import peers_streams  # noqa: E402
from payonce.errors import ConfigError  # noqa: E402
from payonce.torture.postgres import LocalPostgres, bin_dir  # noqa: E402

SYSTEMS = (
    "direct",
    "nginx",
    "python-relay",
    "python-http-relay",
    "litellm",
    "litellm-cache",
    "portkey",
    "payonce-sqlite",
    "payonce-redis",
    "payonce-postgres",
    "payonce-postgres-2x",
)
# Systems that only make sense in some workloads (two gateways: CPU per request is
# not one process's).
ONLY_IN = {
    "payonce-postgres-2x": ("workload2",),
    "python-relay": ("workload5",),
    "python-http-relay": ("workload5",),
}
PORTKEY_VERSION = "1.15.2"
# Its postinstall (patch-package) has no patches to apply in the published package.
NPM_FLAGS = ("--no-audit", "--no-fund", "--ignore-scripts")
WORKLOADS = ("workload1", "workload2", "workload3", "workload4", "workload5")
PROXY_CORE, LOAD_CORE = 1, 0
CHAT = "/v1/chat/completions"
LONG_PROMPT = "Explain idempotency keys for retried LLM calls in detail. " * 8


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Options:
    only: tuple[str, ...]
    systems: tuple[str, ...]
    rounds: int
    duration: int
    warmup: int
    connections: int
    replay_keys: int
    incident_requests: int
    incident_concurrency: int
    incident_rounds: int
    time_scale: float
    streams: int
    calls: int
    call_seconds: int
    call_rate: float
    control_share: float
    stream_events: int
    json_path: Path
    svg_path: Path
    install: bool
    quick: bool
    baseline_src: Path | None = None


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        description="payonce beside nginx, the LiteLLM proxy and Portkey: same machine, same run.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--only", default=",".join(WORKLOADS), help="workloads to run, in this order"
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="systems to run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=10, help="workload 1: s per run")
    parser.add_argument("--warmup", type=int, default=2, help="workload 1: discarded s")
    parser.add_argument("--connections", type=int, default=32, help="workload 1: wrk -c")
    parser.add_argument("--replay-keys", type=int, default=100)
    parser.add_argument("--incident-requests", type=int, default=2000)
    parser.add_argument(
        "--incident-concurrency",
        type=int,
        default=50,
        help="workload 2: business requests at once (the demo's 50)",
    )
    parser.add_argument(
        "--incident-rounds",
        type=int,
        default=None,
        help="workload 2's rounds (default: --rounds); LiteLLM's take minutes each",
    )
    parser.add_argument(
        "--time-scale", type=float, default=0.1, help="workload 2: durations x this (the demo's)"
    )
    parser.add_argument("--streams", type=int, default=200, help="workload 3")
    parser.add_argument(
        "--stream-events",
        type=int,
        default=1000,
        help="workload 5: tokens per stream (the simulator answers at most 1,024)",
    )
    parser.add_argument("--calls", type=int, default=5000, help="workload 4")
    parser.add_argument("--call-seconds", type=int, default=30, help="workload 4")
    parser.add_argument("--call-rate", type=float, default=500, help="workload 4: starts/s")
    parser.add_argument(
        "--control-share",
        type=float,
        default=0.1,
        help="workload 4: this many more calls per call sent direct, in the same run",
    )
    parser.add_argument("--json", type=Path, default=Path("peers.json"), dest="json_path")
    parser.add_argument("--svg", type=Path, default=Path("peers.svg"), dest="svg_path")
    parser.add_argument("--no-install", action="store_true", help="never apt-get install")
    parser.add_argument(
        "--baseline-src",
        type=Path,
        default=None,
        help="a checkout of an earlier payonce: each payonce system runs again from DIR/src",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small runs of everything: 1 round, 2 s per wrk run, 200 business requests,"
        " 50 streams, 400 calls of 4 s",
    )
    args = parser.parse_args(argv)
    # In the order given: the longest (the incident, with LiteLLM) can go last.
    only = tuple(dict.fromkeys(name for name in args.only.split(",") if name in WORKLOADS))
    systems = tuple(name for name in SYSTEMS if name in args.systems.split(","))
    if args.baseline_src is not None:
        if not (args.baseline_src / "src" / "payonce").is_dir():
            parser.error(f"--baseline-src: no src/payonce in {args.baseline_src}")
        # Each right after its own system: the rounds interleave them.
        systems = tuple(
            name
            for system in systems
            for name in (system, f"{system}-baseline")
            if name == system or system.startswith("payonce")
        )
    unknown = set(args.only.split(",")) - set(WORKLOADS)
    unknown |= set(args.systems.split(",")) - set(SYSTEMS)
    if unknown or not only or not systems:
        parser.error(f"unknown or empty: {sorted(unknown)}; workloads {WORKLOADS}, {SYSTEMS}")
    options = Options(
        only=only,
        systems=systems,
        rounds=args.rounds,
        duration=args.duration,
        warmup=args.warmup,
        connections=args.connections,
        replay_keys=args.replay_keys,
        incident_requests=args.incident_requests,
        incident_concurrency=args.incident_concurrency,
        incident_rounds=args.rounds if args.incident_rounds is None else args.incident_rounds,
        time_scale=args.time_scale,
        streams=args.streams,
        calls=args.calls,
        call_seconds=args.call_seconds,
        call_rate=args.call_rate,
        control_share=args.control_share,
        stream_events=args.stream_events,
        json_path=args.json_path,
        svg_path=args.svg_path,
        install=not args.no_install,
        quick=args.quick,
        baseline_src=args.baseline_src.resolve() if args.baseline_src else None,
    )
    if args.quick:
        options = _quick(options, sys.argv[1:] if argv is None else list(argv))
    return options


def _quick(options: Options, argv: Sequence[str]) -> Options:
    """--quick: smaller defaults for whatever the command line did not set itself."""
    given = {arg.split("=")[0].lstrip("-").replace("-", "_") for arg in argv}
    small = {
        "rounds": 1,
        "incident_rounds": 1,
        "duration": 2,
        "warmup": 1,
        "replay_keys": 20,
        "incident_requests": 200,
        "streams": 50,
        "calls": 400,
        "call_seconds": 4,
        "call_rate": 400,
        "stream_events": 40,
    }
    values = {**options.__dict__}
    values.update({key: value for key, value in small.items() if key not in given})
    return Options(**values)


# --------------------------------------------------------------------------- processes


def pin(pid: int, core: int) -> None:
    """Pin ``pid``, its threads and its children to ``core`` (no-op on one core)."""
    if (os.cpu_count() or 1) < 2:
        return
    for member in go.process_tree(pid):
        for task in Path(f"/proc/{member}/task").glob("*"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(task.name), {core})


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants."""
    total = 0
    for member in go.process_tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def runq_wait_s(pid: int) -> float:
    """Seconds ``pid``'s threads (and children's) were runnable but waited for a core.

    From /proc/PID/task/TID/schedstat: on a shared machine, the time other
    programs took from the process under test (the noise of a wall-clock figure).
    """
    waited = 0
    for member in go.process_tree(pid):
        for task in Path(f"/proc/{member}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                waited += int((task / "schedstat").read_text().split()[1])
    return waited / 1e9


def wait_idle(pid: int, timeout: float = 60.0) -> None:
    """Until ``pid`` uses under 5% of a core for a second (or ``timeout``).

    LiteLLM goes on with start-up work in the background for a while after it
    answers; counted in a run's CPU, it made a short first run cost several times more.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = go.cpu_us(pid)
        time.sleep(1.0)
        if go.cpu_us(pid) - before < 50_000:
            return


def open_fds(pid: int) -> int:
    with contextlib.suppress(OSError):
        return len(os.listdir(f"/proc/{pid}/fd"))
    return 0


class Sampler:
    """Peak RSS (and open descriptors) of one process tree, sampled in a thread."""

    def __init__(self, pid: int, every: float = 0.1) -> None:
        self.pid, self.every = pid, every
        self.before = rss_bytes(pid)
        self.peak, self.peak_fds = self.before, open_fds(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.peak = max(self.peak, rss_bytes(self.pid))
            self.peak_fds = max(self.peak_fds, open_fds(self.pid))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def histogram(url: str, name: str) -> dict[float, float]:
    """The cumulative buckets of histogram ``name`` at ``url``'s /_payonce/metrics (le: count)."""
    with urllib.request.urlopen(f"{url}/_payonce/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = re.findall(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', text, re.MULTILINE)
    return {float(bound): float(count) for bound, count in found}


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The upper bound of the bucket holding quantile ``q`` of what was observed between
    two scrapes (seconds; inf if past the last bound, 0 if nothing was observed)."""
    counts = {bound: after[bound] - before.get(bound, 0.0) for bound in sorted(after)}
    total = counts.get(float("inf"), 0.0)
    if not total:
        return 0.0
    return next(bound for bound, count in counts.items() if count >= q * total)


def raise_nofile() -> int:
    """This process's (and so every child's) descriptor limit, raised to the hard limit."""
    return peers_load.raise_nofile()


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


@dataclass
class Stack:
    """The processes of one run; started lazily, stopped at the end."""

    workdir: Path
    options: Options
    exits: contextlib.ExitStack
    wrk: str = ""
    nginx_binary: str | None = None
    redis_binary: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    _sims: dict[str, tuple[go.Service, str]] = field(default_factory=dict)
    _litellm: dict[bool, tuple[go.Service, str]] = field(default_factory=dict)
    _redis: str | None = None
    redis_pid: int | None = None  # its CPU is the Redis store's, reported beside the gateway's
    _postgres: LocalPostgres | None = None
    postgres_pid: int | None = None  # the postmaster: its backends are its children

    def store_pid(self, system: str) -> int | None:
        """The process (tree) whose CPU is ``system``'s store's, counted beside it."""
        if system.startswith("payonce-redis"):
            return self.redis_pid
        if system.startswith("payonce-postgres"):
            return self.postgres_pid
        return None

    def sim(self, name: str) -> tuple[go.Service, str]:
        """A simulator: "fast" (fixed:0; X-Sim-* headers pace it) or "incident:SYSTEM".

        Each system gets its own incident simulator: a proxy that goes on retrying
        after its clients gave up (LiteLLM's Router does) bills its own ledger only.
        """
        if name not in self._sims:
            port = go.free_port()
            command = [*go.payonce_command(), "sim", "--port", str(port)]
            if name == "fast":
                command += ["--latency", "fixed:0"]
            else:
                scale = self.options.time_scale
                command += [
                    "--latency",
                    f"lognormal:p50={4000 * scale:g}ms,p99={30000 * scale:g}ms",
                ]
                command += ["--fail", "500:0.01", "--seed", "7"]
            service = go.start_service(f"sim-{name.replace(':', '-')}", command, self.workdir)
            self.exits.callback(service.stop)
            url = f"http://127.0.0.1:{port}"
            go.wait_ready(service, f"{url}/_sim/health")
            pin(service.pid, LOAD_CORE)
            self._sims[name] = (service, url)
        return self._sims[name]

    def redis(self) -> str:
        if self._redis is None:
            binary = self.redis_binary or "redis-server"
            port = go.free_port()
            command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
            command += ["--appendonly", "no", "--dir", str(self.workdir)]
            service = go.start_service("redis", command, self.workdir)
            self.exits.callback(service.stop)
            deadline = time.monotonic() + 20
            while not go.redis_ping(port):
                if not service.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start:\n{service.log_tail()}")
                time.sleep(0.05)
            # On the gateway's core, as SQLite is (its thread is in the gateway's process):
            # on the load core, beside the simulator and the load generators, a burst of
            # 500 claims waited up to 358 ms for Redis to be scheduled (workload 4).
            pin(service.pid, PROXY_CORE)
            self.redis_pid = service.pid
            self._redis = f"redis://127.0.0.1:{port}/0"
        return self._redis

    def postgres(self) -> str:
        """A PostgreSQL server of the run's own, with PostgreSQL's durable defaults.

        LocalPostgres turns ``fsync`` off for the tests; a benchmark of the store
        teams run measures what they run: every commit flushed to disk.
        """
        if self._postgres is None:
            settings = ("fsync = on", "max_connections = 100", "shared_buffers = 128MB")
            server = LocalPostgres(go.free_port(), settings)
            self.exits.callback(server.remove)
            server.create()
            assert server.process is not None
            pin(server.process.pid, PROXY_CORE)  # as Redis: on the gateway's core
            self.postgres_pid = server.process.pid
            self._postgres = server
        return self._postgres.url

    def litellm(self, cache: bool) -> tuple[go.Service, str]:
        """The LiteLLM proxy, one deployment per simulator; with ``cache``, its cache on."""
        if cache not in self._litellm:
            installation = litellm_support.prepare()
            system = "litellm-cache" if cache else "litellm"
            sims = {"incident": f"incident:{system}"}
            if not cache:
                sims["gpt-4o-mini"] = "fast"
            deployments = {
                model: {"model": "openai/gpt-4o-mini", "api_base": f"{self.sim(sim)[1]}/v1"}
                for model, sim in sims.items()
            }
            text = litellm_support.config_text(self.sim("fast")[1], deployments)
            if cache:
                text += "litellm_settings:\n  cache: true\n  cache_params:\n    type: local\n"
            folder = self.workdir / f"litellm-{'cache' if cache else 'plain'}"
            folder.mkdir()
            (folder / "config.yaml").write_text(text)
            print(f"# starting LiteLLM {litellm_support.LITELLM_VERSION} ...", flush=True)
            process = litellm_support.start_proxy(installation, folder / "config.yaml", folder)
            service = go.Service("litellm", process.popen, process.log)
            self.exits.callback(process.stop)
            pin(service.pid, PROXY_CORE)
            self._litellm[cache] = (service, process.url)
            self.versions["litellm"] = litellm_support.LITELLM_VERSION
        return self._litellm[cache]

    def portkey_script(self) -> Path:
        """Portkey's gateway from npm at the pinned version, in .venv/portkey/ (made once)."""
        home = ROOT / ".venv" / "portkey" / PORTKEY_VERSION
        script = home / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
        if not (home / ".complete").exists():
            npm = go.ensure_binary("npm", ["npm"], self.options.install)
            if npm is None or go.ensure_binary("node", ["nodejs"], self.options.install) is None:
                raise RuntimeError("portkey needs node and npm (apt-get install -y nodejs npm)")
            home.mkdir(parents=True, exist_ok=True)
            print(f"# installing @portkey-ai/gateway@{PORTKEY_VERSION} with npm ...", flush=True)
            package = f"@portkey-ai/gateway@{PORTKEY_VERSION}"
            done = subprocess.run(
                [npm, "install", "--prefix", str(home), *NPM_FLAGS, package],
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            if done.returncode != 0 or not script.exists():
                raise RuntimeError(f"npm install {package} failed:\n{done.stderr[-2000:]}")
            (home / ".complete").touch()
        node = go.find_binary("node") or "node"
        node_version = _version(go.tool_version([node, "--version"]))
        self.versions["portkey"] = f"{PORTKEY_VERSION} (node {node_version})"
        return script

    @contextlib.contextmanager
    def portkey(self, name: str) -> Iterator[tuple[go.Service, str]]:
        """Portkey's open-source gateway (Node), routed per request by its headers."""
        script = self.portkey_script()
        port = go.free_port()
        command = [go.find_binary("node") or "node", str(script), f"--port={port}", "--headless"]
        with self._pinned(name, command, port, "/", timeout=60) as started:
            yield started

    @contextlib.contextmanager
    def _pinned(
        self,
        name: str,
        command: list[str],
        port: int,
        ready: str,
        *,
        env: dict[str, str] | None = None,
        timeout: float = 20.0,
    ) -> Iterator[tuple[go.Service, str]]:
        """``command`` started, ready at ``ready`` on ``port``, pinned to the proxies' core."""
        service = go.start_service(name, command, self.workdir, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            go.wait_ready(service, url + ready, timeout=timeout)
            pin(service.pid, PROXY_CORE)
            yield service, url
        finally:
            service.stop()

    @contextlib.contextmanager
    def payonce(
        self, store: str, upstream: str, name: str, src: Path | None = None
    ) -> Iterator[tuple[go.Service, str]]:
        port = go.free_port()
        if store == "redis":
            store_url = self.redis()
        elif store.startswith("postgres"):
            store_url = self.postgres()
        else:
            store_url = f"sqlite:///{self.workdir}/{name}.db"
        if store == "redis":
            flush = subprocess.run(
                ["redis-cli", "-u", store_url, "FLUSHALL"], capture_output=True, check=False
            )
            del flush  # an empty Redis: best effort (redis-cli comes with redis-server)
        command = [*go.payonce_command(), "serve", "--upstream", upstream, "--store", store_url]
        command += ["--port", str(port), "--log-level", "warning", "--no-otel"]
        env = None if src is None else {**os.environ, "PYTHONPATH": str(src / "src")}
        with self._pinned(name, command, port, "/_payonce/health", env=env) as started:
            yield started

    @contextlib.contextmanager
    def nginx(self, upstream: str, name: str, *more: str) -> Iterator[tuple[go.Service, str]]:
        """nginx in front of ``upstream`` (and ``more``: round robin between them)."""
        if self.nginx_binary is None:
            raise RuntimeError("nginx is not installed")
        port = go.free_port()
        root = self.workdir / name
        root.mkdir(exist_ok=True)
        servers = " ".join(f"server {url.removeprefix('http://')};" for url in (upstream, *more))
        (root / "nginx.conf").write_text(_NGINX.format(root=root, port=port, servers=servers))
        command = [self.nginx_binary, "-c", str(root / "nginx.conf"), "-p", f"{root}/"]
        with self._pinned(name, command, port, "/_sim/health") as started:
            yield started

    @contextlib.contextmanager
    def python_relay(
        self, upstream: str, name: str, http: bool = False
    ) -> Iterator[tuple[go.Service, str]]:
        """benchmarks/relay_floor.py in front of ``upstream``: the floor of a Python relay
        (``http``: of one that parses the responses and frames their chunks again)."""
        port = go.free_port()
        script = HERE / "relay_floor.py"
        command = [sys.executable, str(script), "--port", str(port), "--upstream", upstream]
        if http:
            command.append("--http")
        with self._pinned(name, command, port, "/_sim/health") as started:
            yield started


_NGINX = """\
daemon off;
worker_processes 1;
worker_rlimit_nofile 30000;
error_log {root}/error.log warn;
pid {root}/nginx.pid;
events {{ worker_connections 12000; }}
http {{
    access_log off;
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    keepalive_requests 1000000;
    upstream backend {{
        {servers}
        keepalive 64;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


@dataclass(frozen=True)
class Endpoint:
    """One system as the load sees it: where to send, as whom, and whose CPU to count."""

    system: str
    url: str
    service: go.Service
    sim_url: str  # the simulator behind it, whose ledger says what was billed
    authorization: str = go.AUTHORIZATION
    model: str = "gpt-4o-mini"
    keyed: bool = False  # payonce: the keyed and replay loads mean something
    headers: tuple[tuple[str, str], ...] = ()  # sent on every request (Portkey's routing)


@contextlib.contextmanager
def endpoints(stack: Stack, sim: str, systems: Sequence[str]) -> Iterator[list[Endpoint]]:
    """Every system in ``systems`` in front of the simulator ``sim`` (incident: its own)."""
    found: list[Endpoint] = []
    with contextlib.ExitStack() as exits:
        for system in systems:
            sim_name = f"incident:{system}" if sim == "incident" else sim
            sim_service, sim_url = stack.sim(sim_name)
            name = f"{system}-{sim}"
            if system == "direct":
                found.append(Endpoint(system, sim_url, sim_service, sim_url))
            elif system == "nginx":
                service, url = exits.enter_context(stack.nginx(sim_url, name))
                found.append(Endpoint(system, url, service, sim_url))
            elif system in ("python-relay", "python-http-relay"):
                http = system == "python-http-relay"
                service, url = exits.enter_context(stack.python_relay(sim_url, name, http))
                found.append(Endpoint(system, url, service, sim_url))
            elif system.startswith("litellm"):
                service, url = stack.litellm(cache=system == "litellm-cache")
                auth = f"Bearer {litellm_support.MASTER_KEY}"
                model = "incident" if sim == "incident" else "gpt-4o-mini"
                found.append(Endpoint(system, url, service, sim_url, auth, model))
            elif system == "portkey":
                service, url = exits.enter_context(stack.portkey(name))
                route = (
                    ("x-portkey-provider", "openai"),
                    ("x-portkey-custom-host", sim_url + "/v1"),
                )
                found.append(Endpoint(system, url, service, sim_url, headers=route))
            elif system == "payonce-postgres-2x":
                # Two replicas on one database behind one port; the balancer's service
                # stands for the system (its CPU is not the figure here: the bill is).
                _, one = exits.enter_context(stack.payonce("postgres", sim_url, name + "-1"))
                _, two = exits.enter_context(stack.payonce("postgres", sim_url, name + "-2"))
                service, url = exits.enter_context(stack.nginx(one, name, two))
                found.append(Endpoint(system, url, service, sim_url, keyed=True))
            else:
                store = system.removeprefix("payonce-").removesuffix("-baseline")
                src = stack.options.baseline_src if system.endswith("-baseline") else None
                service, url = exits.enter_context(stack.payonce(store, sim_url, name, src))
                found.append(Endpoint(system, url, service, sim_url, keyed=True))
        yield found


# --------------------------------------------------------------------------- statistics


def summary(values: Sequence[float | None]) -> dict[str, float | None]:
    """Median, min and max of the rounds' values (None where a round had none)."""
    present = [value for value in values if value is not None]
    if not present:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(present), "min": min(present), "max": max(present)}


def percentile(values: Sequence[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run_load(job: dict[str, Any], workdir: Path, processes: int = 1) -> list[dict[str, Any]]:
    """Run ``peers_load.py`` on the load core, split over ``processes``; their documents."""
    shares = []
    for part in range(processes):
        share = dict(job)
        if "count" in job and processes > 1:
            share["count"] = job["count"] // processes + (part < job["count"] % processes)
            share["rate"] = job["rate"] / processes
            if job.get("control_count"):
                extra = int(job["control_count"])
                share["control_count"] = extra // processes + (part < extra % processes)
        shares.append(share)
    return run_jobs(shares, workdir)


def run_jobs(
    jobs: list[dict[str, Any]], workdir: Path, *, pin: bool = True
) -> list[dict[str, Any]]:
    """Run one ``peers_load.py`` per job at once (on the load core if ``pin``); their documents."""
    children = []
    for job in jobs:
        spec = workdir / f"load-{secrets.token_hex(4)}.json"
        spec.write_text(json.dumps(job))
        command = [sys.executable, str(HERE / "peers_load.py"), str(spec)]
        if pin and (os.cpu_count() or 1) >= 2:
            command = ["taskset", "-c", str(LOAD_CORE), *command]
        children.append(
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
        )
    documents = []
    for child in children:
        out, err = child.communicate(timeout=3600)
        if child.returncode != 0:
            raise RuntimeError(f"load generator failed:\n{err.decode(errors='replace')[-3000:]}")
        documents.append(json.loads(out))
    return documents


def ledger(sim_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{sim_url}/_sim/ledger?entries=0", timeout=10) as answer:
        document: dict[str, Any] = json.load(answer)
        return document


def reset(sim_url: str) -> None:
    go.reset_sim(sim_url)


def wait_quiet(sim_url: str, settle: float, timeout: float = 240.0) -> dict[str, Any]:
    """The ledger once nothing is generating and no request came for ``settle`` seconds.

    A proxy may go on retrying after its clients gave up; those calls are billed too.
    """
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while True:
        document = ledger(sim_url)
        if document["requests"] != last:
            last, since = document["requests"], time.monotonic()
        quiet = time.monotonic() - since >= settle
        if (document["generating"] == 0 and quiet) or time.monotonic() > deadline:
            document["settled"] = document["generating"] == 0 and quiet
            return document
        time.sleep(0.1)


# --------------------------------------------------------------------------- workload 1


def _lua(endpoint: Endpoint, kind: str, keys: Sequence[str]) -> str:
    body = go.BODY.replace("gpt-4o-mini", endpoint.model)
    script = go._LUA_COMMON.format(body=body, authorization=endpoint.authorization)
    script += "".join(f'wrk.headers["{name}"] = "{value}"\n' for name, value in endpoint.headers)
    if kind == "first":
        script += go._LUA_FIRST_CALL.format(nonce="peers-" + secrets.token_hex(6))
    elif kind == "replay":
        script += go._LUA_REPLAY.format(keys=", ".join(f'"{key}"' for key in keys))
    return script


def wrk(stack: Stack, endpoint: Endpoint, kind: str, keys: Sequence[str], seconds: int) -> Any:
    script = stack.workdir / f"wrk-{secrets.token_hex(3)}.lua"
    script.write_text(_lua(endpoint, kind, keys))
    command = [stack.wrk, "-t1", f"-c{stack.options.connections}", f"-d{seconds}s"]
    command += ["--timeout", "10s", "-s", str(script), endpoint.url + CHAT]
    if (os.cpu_count() or 1) >= 2:
        command = ["taskset", "-c", str(LOAD_CORE), *command]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    match = re.search(r"^@@wrk ((?:\d+ ?){9})$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    values = [int(value) for value in match.group(1).split()]
    return go.WrkResult(values[0], values[1] / 1e6, *values[2:])


def workload1(stack: Stack) -> dict[str, Any]:
    """Throughput and CPU per request at zero upstream latency, interleaved rounds."""
    options = stack.options
    systems = [
        name for name in options.systems if name != "litellm-cache" and _runs_in(name, "workload1")
    ]
    rows: dict[str, list[dict[str, Any]]] = {}
    with endpoints(stack, "fast", systems) as found:
        plan: list[tuple[Endpoint, str, tuple[str, ...]]] = []
        for endpoint in found:
            if endpoint.keyed:
                keys = go.make_replay_keys(endpoint.url, options.replay_keys)
                plan += [(endpoint, kind, keys) for kind in ("nokey", "first", "replay")]
            else:
                plan.append((endpoint, "nokey" if endpoint.system == "direct" else "first", ()))
        for endpoint, kind, keys in plan:  # past start-up work (LiteLLM's is seconds)
            if options.warmup:
                wrk(stack, endpoint, kind, keys, 2 * options.warmup)
            wait_idle(endpoint.service.pid)
        for number in range(options.rounds):
            for endpoint, kind, keys in plan:
                name = f"{endpoint.system} {kind}"
                if options.warmup:
                    wrk(stack, endpoint, kind, keys, options.warmup)
                usage = Usage.now(endpoint.service.pid)
                store = stack.store_pid(endpoint.system)
                store_usage = Usage.now(store) if store is not None else None
                result = wrk(stack, endpoint, kind, keys, options.duration)
                used = usage.since(result.requests)
                store_cpu = store_usage.since(result.requests)["cpu_us_per_call"] if (
                    store_usage is not None and result.requests
                ) else None  # fmt: skip
                cpu = used["cpu_us_per_call"] if result.requests else None
                row = {
                    "rps": result.rps,
                    "cpu_us": cpu,
                    "store_cpu_us": store_cpu,
                    "cpu_us_with_store": None if cpu is None else cpu + (store_cpu or 0.0),
                    "runq_wait": used["runq_wait"],
                    "p50_ms": result.p50_us / 1000,
                    "p99_ms": result.p99_us / 1000,
                    "requests": result.requests,
                    "errors": result.errors,
                    "load": load_average()[0],
                }
                rows.setdefault(name, []).append(row)
                print(
                    f"# w1 round {number + 1} {name}: {row['rps']:,.0f} req/s,"
                    f" {row['cpu_us'] or 0:,.0f} µs CPU/req"
                    + (f" (+{store_cpu:,.0f} store)" if store_cpu is not None else "")
                    + f", errors {result.errors}",
                    flush=True,
                )
    return {
        name: {key: summary([row[key] for row in runs]) for key in runs[0]} | {"rounds": runs}
        for name, runs in rows.items()
    }


# --------------------------------------------------------------------------- workload 2


def workload2(stack: Stack) -> dict[str, Any]:
    """The incident: billed generations per business request, by system."""
    options = stack.options
    rows: dict[str, list[dict[str, Any]]] = {}
    timeout = 10 * options.time_scale
    systems = [name for name in options.systems if _runs_in(name, "workload2")]
    with endpoints(stack, "incident", systems) as found:
        # Each payonce system also runs with no key sent at all: its SDK retries are
        # matched by x-stainless-retry-count (docs/gateway.md), nothing in the client.
        runs = [(endpoint, False) for endpoint in found] + [
            (endpoint, True) for endpoint in found if endpoint.system.startswith("payonce")
        ]
        for number in range(options.incident_rounds):
            for endpoint, no_key in runs:
                system = endpoint.system + (", no key sent" if no_key else "")
                sim_url = endpoint.sim_url
                reset(sim_url)
                job = {
                    "kind": "incident",
                    "no_key": no_key,
                    "headers": dict(endpoint.headers),
                    "base_url": endpoint.url + "/v1",
                    "api_key": endpoint.authorization.removeprefix("Bearer "),
                    "model": endpoint.model,
                    "timeout": timeout,
                    "time_scale": options.time_scale,
                    "concurrency": options.incident_concurrency,
                    "count": options.incident_requests,
                }
                started, usage = time.monotonic(), Usage.now(endpoint.service.pid)
                (document,) = run_load(job, stack.workdir)
                used = usage.since(options.incident_requests)
                book = wait_quiet(sim_url, settle=max(1.0, 20 * options.time_scale))
                outcomes = document["outcomes"]
                row = {
                    "billed": book["billed"],
                    "billed_per_request": book["billed"] / options.incident_requests,
                    "upstream_requests": book["requests"],
                    "answered": outcomes.get("ok", 0),
                    "outcomes": outcomes,
                    "p50_s": percentile(document["latencies"], 0.5),
                    "p99_s": percentile(document["latencies"], 0.99),
                    "seconds": time.monotonic() - started,
                    "still_generating": book["generating"],
                    "settled": book["settled"],  # False: still billing when it was read
                    "cpu_us_per_request": used["cpu_us_per_call"],
                    "cores_busy": used["cores_busy"],
                    "runq_wait": used["runq_wait"],
                    "load": load_average()[0],
                }
                rows.setdefault(system, []).append(row)
                print(
                    f"# w2 round {number + 1} {system}: billed {row['billed']}"
                    f" for {options.incident_requests} ({row['billed_per_request']:.3f}),"
                    f" answered {row['answered']}, {row['seconds']:.0f} s",
                    flush=True,
                )
    numeric = ("billed", "billed_per_request", "upstream_requests", "answered", "p50_s", "p99_s")
    numeric += ("cpu_us_per_request", "cores_busy", "runq_wait")
    return {
        name: {key: summary([row[key] for row in runs]) for key in numeric} | {"rounds": runs}
        for name, runs in rows.items()
    }


# --------------------------------------------------------------------------- workloads 3, 4


def _calls_job(endpoint: Endpoint, count: int, rate: float, *, stream: bool, seconds: float,
               token_ms: int, tokens: int, timeout: float,
               sized: bool = False) -> dict[str, Any]:  # fmt: skip
    # sized: a prompt of ``tokens`` tokens, so that the simulator's answer has that
    # many (its answer is the prompt's length in tokens, 16 to 1,024, capped by
    # max_tokens: LONG_PROMPT alone gives 118).
    prompt = "tok " * tokens if sized else LONG_PROMPT
    body: dict[str, Any] = {
        "model": endpoint.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
    }
    headers = {"Authorization": endpoint.authorization, "Content-Type": "application/json"}
    headers.update(endpoint.headers)
    if stream:
        body["stream"] = True
        headers["X-Sim-Token-Ms"] = str(token_ms)
    headers["X-Sim-Delay-Ms"] = str(int(seconds * 1000))
    return {
        "kind": "calls",
        "url": endpoint.url + CHAT,
        "headers": headers,
        "body": json.dumps(body),
        "count": count,
        "rate": rate,
        "timeout": timeout,
        "key_prefix": f"peers-{secrets.token_hex(4)}" if endpoint.keyed else "",
    }


def _call_stats(results: Sequence[Sequence[Any]]) -> dict[str, Any]:
    ok = [r for r in results if r[0] == 200 and not r[3] and r[1] is not None]
    failures: dict[str, int] = {}
    for r in results:
        if r not in ok:
            reason = r[3] or f"status {r[0]}"
            failures[reason] = failures.get(reason, 0) + 1
    ttfb = [r[1] * 1000 for r in ok]
    total = [r[2] * 1000 for r in ok]
    return {
        "calls": len(results),
        "answered": len(ok),
        "failures": failures,
        "ttfb_p50_ms": percentile(ttfb, 0.5),
        "ttfb_p99_ms": percentile(ttfb, 0.99),
        "total_p50_ms": percentile(total, 0.5),
        "total_p99_ms": percentile(total, 0.99),
    }


@dataclass(frozen=True)
class Usage:
    """The process under test's CPU and run-queue wait when a measurement starts."""

    pid: int
    cpu_us: float
    waited_s: float
    started: float

    @classmethod
    def now(cls, pid: int) -> Usage:
        return cls(pid, go.cpu_us(pid), runq_wait_s(pid), time.monotonic())

    def since(self, calls: int) -> dict[str, float]:
        """CPU per call, cores busy, and the share of the wall time it waited for a core."""
        spent = go.cpu_us(self.pid) - self.cpu_us
        wall = time.monotonic() - self.started
        waited = runq_wait_s(self.pid) - self.waited_s
        return {
            "cpu_us_per_call": spent / calls if calls else 0.0,
            "cores_busy": spent / 1e6 / wall,
            "runq_wait": waited / wall,
        }


def _added(row: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    for key in ("ttfb_p50_ms", "ttfb_p99_ms", "total_p50_ms", "total_p99_ms"):
        if row.get(key) is not None and base.get(key) is not None:
            row[f"added_{key}"] = row[key] - base[key]
    return row


def workload3(stack: Stack) -> dict[str, Any]:
    """Concurrent streams: added time to first byte and total time, peak memory."""
    options = stack.options
    systems = [
        name for name in options.systems if name != "litellm-cache" and _runs_in(name, "workload3")
    ]
    if "direct" not in systems:
        systems.insert(0, "direct")
    rows: dict[str, list[dict[str, Any]]] = {}
    reset(stack.sim("fast")[1])  # workload 1 left a million bill lines in its memory
    with endpoints(stack, "fast", systems) as found:
        for number in range(options.rounds):
            base: dict[str, Any] = {}
            for endpoint in found:
                job = _calls_job(endpoint, options.streams, 2000.0, stream=True, seconds=0.1,
                                 token_ms=50, tokens=20, timeout=120)  # fmt: skip
                usage = Usage.now(endpoint.service.pid)
                with Sampler(endpoint.service.pid) as sampler:
                    (document,) = run_load(job, stack.workdir)
                row = _call_stats(document["results"])
                row |= usage.since(options.streams)
                row["rss_before_mib"] = sampler.before / 2**20
                row["rss_peak_mib"] = sampler.peak / 2**20
                row["load"] = load_average()[0]
                if endpoint.system == "direct":
                    base = row
                rows.setdefault(endpoint.system, []).append(_added(row, base))
                print(
                    f"# w3 round {number + 1} {endpoint.system}: {row['answered']}/"
                    f"{row['calls']} streams, TTFB p99 {row['ttfb_p99_ms'] or 0:.1f} ms,"
                    f" total p99 {row['total_p99_ms'] or 0:.0f} ms,"
                    f" RSS peak {row['rss_peak_mib']:.0f} MiB",
                    flush=True,
                )
    return _summarised(rows)


def _summarised(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    result = {}
    for name, runs in rows.items():
        keys = [k for k, v in runs[0].items() if isinstance(v, int | float) or v is None]
        result[name] = {k: summary([run.get(k) for run in runs]) for k in keys}
        result[name]["rounds"] = runs
    return result


def workload4(stack: Stack) -> dict[str, Any]:
    """Thousands of concurrent long keyed calls on one payonce worker.

    Each run also sends ``--control-share`` more calls of the same kinds straight to
    the simulator, from the same load generators in the same seconds: the added time
    to first byte is the run's calls against those (the direct system's run, against
    its own control, shows the method's noise). A separate direct run a minute
    apart differs by hundreds of milliseconds at p99 on a small machine, so it is
    kept only as ``vs_direct_run``.
    """
    options = stack.options
    systems = ["direct"] + [
        name
        for name in options.systems
        if name.startswith("payonce") and _runs_in(name, "workload4")
    ]
    rows: dict[str, list[dict[str, Any]]] = {}
    streams = options.calls // 2
    reset(stack.sim("fast")[1])  # workload 1 left a million bill lines in its memory
    with endpoints(stack, "fast", systems) as found:
        direct = found[0]
        idle = {endpoint.system: rss_bytes(endpoint.service.pid) for endpoint in found}
        for number in range(options.rounds):  # interleaved: each takes call_seconds + the ramp
            base: dict[str, Any] = {}
            for endpoint in found:
                row = _long_calls(stack, endpoint, direct, streams, idle[endpoint.system])
                if endpoint.system == "direct":
                    base = row
                for label in ("stream", "whole"):
                    if base and endpoint.system != "direct":
                        row[f"{label}_vs_direct_run_ttfb_p99_ms"] = _difference(
                            row[label]["ttfb_p99_ms"], base[label]["ttfb_p99_ms"]
                        )
                rows.setdefault(endpoint.system, []).append(row)
                print(
                    f"# w4 round {number + 1} {endpoint.system}: answered {row['answered']}/"
                    f"{options.calls}, added TTFB p99 (same-run control) streams"
                    f" {row['stream_added_ttfb_p99_ms'] or 0:+.0f} ms, whole"
                    f" {row['whole_added_ttfb_p99_ms'] or 0:+.0f} ms,"
                    f" RSS {row['rss_before_mib']:.0f} -> {row['rss_peak_mib']:.0f} MiB,"
                    f" fds {row['peak_fds']}, {row['cores_busy']:.2f} cores busy,"
                    f" waited for a core {row['runq_wait']:.0%} of the time",
                    flush=True,
                )
    return _summarised(rows)


def _difference(value: float | None, base: float | None) -> float | None:
    return None if value is None or base is None else value - base


def _long_calls(
    stack: Stack, endpoint: Endpoint, direct: Endpoint, streams: int, idle: int
) -> dict[str, Any]:
    """One run of workload 4 on ``endpoint``, with its control calls to ``direct``.

    ``idle``: the process's RSS before its first run (a Python heap, once grown, is
    not given back: later rounds start higher). payonce's own histograms say how
    late its event loop was and how long the cycle collector stopped it.
    """
    options = stack.options
    seconds = options.call_seconds
    kinds: list[tuple[int, dict[str, Any]]] = [
        (streams, dict(stream=True, seconds=1, token_ms=1000, tokens=seconds - 1)),
        (options.calls - streams, dict(stream=False, seconds=seconds, token_ms=0, tokens=16)),
    ]
    jobs = []
    for count, kind in kinds:
        job = _calls_job(endpoint, count, options.call_rate / 2, timeout=seconds * 4 + 60, **kind)
        control = _calls_job(direct, 0, 0, timeout=0, **kind)
        job["control"] = {"url": control["url"], "headers": control["headers"]}
        job["control_count"] = round(count * options.control_share)
        jobs.append(job)
    own = endpoint.system.startswith("payonce")
    names = ("payonce_event_loop_lag_seconds", "payonce_gc_pause_seconds")
    before = {name: histogram(endpoint.url, name) for name in names} if own else {}
    usage = Usage.now(endpoint.service.pid)
    # SQLite's work is in the gateway's process; Redis's in redis-server's, PostgreSQL's
    # in its backends: counted apart.
    store = stack.store_pid(endpoint.system)
    store_usage = Usage.now(store) if store is not None else None
    with (
        Sampler(endpoint.service.pid, every=0.25) as sampler,
        concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool,
    ):
        documents = list(pool.map(functools.partial(run_load, workdir=stack.workdir), jobs))
    row: dict[str, Any] = {"calls": options.calls}
    if own:
        after = {name: histogram(endpoint.url, name) for name in names}
        lag, pause = names
        row["loop_lag_p99_ms"] = 1000 * bucket_quantile(before[lag], after[lag], 0.99)
        row["gc_pause_max_ms"] = 1000 * bucket_quantile(before[pause], after[pause], 1.0)
    row |= usage.since(options.calls)
    if store_usage is not None:
        row["store_cpu_us_per_call"] = store_usage.since(options.calls)["cpu_us_per_call"]
    for label, docs in zip(("stream", "whole"), documents, strict=True):
        row[label] = _call_stats([r for doc in docs for r in doc["results"]])
        row[f"control_{label}"] = _call_stats([r for doc in docs for r in doc["control"]])
        for key in ("ttfb_p50_ms", "ttfb_p99_ms"):
            row[f"{label}_{key}"] = row[label][key]
            row[f"{label}_added_{key}"] = _difference(row[label][key], row[f"control_{label}"][key])
    row["answered"] = row["stream"]["answered"] + row["whole"]["answered"]
    row["control_answered"] = row["control_stream"]["answered"] + row["control_whole"]["answered"]
    row["control_calls"] = row["control_stream"]["calls"] + row["control_whole"]["calls"]
    row["rss_before_mib"] = idle / 2**20
    row["rss_peak_mib"] = sampler.peak / 2**20
    row["rss_per_call_kib"] = (sampler.peak - idle) / options.calls / 1024
    row["peak_fds"] = sampler.peak_fds
    row["load"] = load_average()[0]
    return row


# --------------------------------------------------------------------------- main


def workload5(stack: Stack) -> dict[str, Any]:
    """Streams at token rate: CPU per event against nginx's, extra gaps against direct's."""
    options = stack.options
    loads = peers_streams.QUICK_LOADS if options.quick else peers_streams.LOADS
    chosen = peers_streams.variants([s for s in options.systems if _runs_in(s, "workload5")])
    systems = list(dict.fromkeys(system for system, _ in chosen))
    rows: dict[str, list[dict[str, Any]]] = {}
    reset(stack.sim("fast")[1])
    with endpoints(stack, "fast", systems) as found:
        by_system = {endpoint.system: endpoint for endpoint in found}
        for number in range(options.rounds):
            for streams, token_ms in loads:
                nginx: dict[str, Any] = {}
                direct: dict[str, Any] = {}
                for system, keyed in chosen:
                    endpoint = replace(by_system[system], keyed=keyed)
                    lasts = options.stream_events * token_ms / 1000
                    job = _calls_job(endpoint, streams, 2000.0, stream=True, seconds=0.0,
                                     token_ms=token_ms, tokens=options.stream_events,
                                     timeout=60 + lasts, sized=True)  # fmt: skip
                    job["gaps"] = True
                    usage = Usage.now(endpoint.service.pid)
                    store = stack.store_pid(system)
                    store_usage = Usage.now(store) if store is not None else None
                    (document,) = run_load(job, stack.workdir)
                    cpu = usage.since(1)["cpu_us_per_call"]
                    store_cpu = store_usage.since(1)["cpu_us_per_call"] if store_usage else None
                    row = peers_streams.row_of(document, streams, options.stream_events, cpu,
                                               store_cpu, _call_stats)  # fmt: skip
                    if system == "direct":
                        direct = row
                    if system == "nginx":
                        nginx = row
                    row = peers_streams.compared(row, nginx, direct)
                    row["load"] = load_average()[0]
                    name = f"{peers_streams.label(system, keyed)} {streams}x{1000 // token_ms}/s"
                    rows.setdefault(name, []).append(row)
                    print(
                        f"# w5 round {number + 1} {name}: {row['answered']}/{streams} streams"
                        f" of {row['events_per_stream']:.0f} events,"
                        f" {row['cpu_us_per_event']:.1f} us/event"
                        f" (x nginx {row.get('x_nginx', 0):.2f}),"
                        f" gap p99 {row['gap_p99_ms'] or 0:.1f} ms",
                        flush=True,
                    )
    return _summarised(rows)


def _runs_in(system: str, workload: str) -> bool:
    return workload in ONLY_IN.get(system, (workload,))


RUNNERS: dict[str, Callable[[Stack], dict[str, Any]]] = {
    "workload1": workload1,
    "workload2": workload2,
    "workload3": workload3,
    "workload4": workload4,
    "workload5": workload5,
}


def _version(text: str) -> str:
    """The version number in a tool's banner ("nginx version: nginx/1.22.1": 1.22.1)."""
    found = re.search(r"\d+\.\d+[\w.+~-]*", text)
    return found.group(0) if found else text


def prepare_tools(stack: Stack) -> None:
    options = stack.options
    needs_wrk = "workload1" in options.only
    if needs_wrk:
        found = go.ensure_binary("wrk", ["wrk"], options.install)
        if found is None:
            raise RuntimeError("wrk is required for workload 1 (apt-get install -y wrk)")
        stack.wrk = found
        stack.versions["wrk"] = _version(go.tool_version([found, "-v"]))
    if "nginx" in options.systems or "payonce-postgres-2x" in options.systems:
        stack.nginx_binary = go.ensure_binary("nginx", ["nginx-light", "nginx"], options.install)
        if stack.nginx_binary is None:
            raise RuntimeError("nginx is missing (apt-get install -y nginx)")
        stack.versions["nginx"] = _version(go.tool_version([stack.nginx_binary, "-v"]))
    if any(system.startswith("payonce-postgres") for system in options.systems):
        stack.versions["postgresql"] = bin_dir().parent.name  # raises ConfigError if missing
    if "payonce-redis" in options.systems:
        stack.redis_binary = go.ensure_binary("redis-server", ["redis-server"], options.install)
        if stack.redis_binary is None:
            raise RuntimeError("redis-server is missing (apt-get install -y redis-server)")
        stack.versions["redis"] = _version(go.tool_version([stack.redis_binary, "--version"]))
    stack.versions["python"] = platform.python_version()
    stack.versions["payonce"] = go.git_revision()


def run(options: Options) -> dict[str, Any]:
    nofile = raise_nofile()
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": go.machine_description(),
        "command": " ".join(["benchmarks/peers.py", *sys.argv[1:]]),
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in options.__dict__.items()},
        "nofile": nofile,
        "load_average": {"start": load_average()},
        "results": {},
    }
    print(f"## payonce and its peers, {report['date']}\n# machine: {report['machine']}")
    print(f"# load average at start: {report['load_average']['start']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="payonce-peers-") as tmp, contextlib.ExitStack() as ex:
        stack = Stack(Path(tmp), options, ex)
        prepare_tools(stack)
        for name in options.only:
            report["load_average"][f"{name} start"] = load_average()
            report["results"][name] = RUNNERS[name](stack)
            report["load_average"][f"{name} end"] = load_average()
            report["versions"] = stack.versions
            # Written after each workload: a run that fails later keeps what it measured.
            options.json_path.write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    try:
        report = run(options)
    except (RuntimeError, OSError, subprocess.SubprocessError, ConfigError) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    options.json_path.write_text(json.dumps(report, indent=1) + "\n")
    print(peers_report.table(report))
    options.svg_path.write_text(peers_report.svg(report))
    print(f"# wrote {options.json_path} and {options.svg_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
