"""Instructions per request of the gateway under callgrind, this checkout against a baseline.

Counts instructions, not seconds: the same for the same code whatever else the
machine does, so two checkouts can be compared on a busy machine. Each gateway
runs under ``valgrind --tool=callgrind`` in front of ``payonce sim`` (zero
latency, SQLite store); one keep-alive connection sends requests one after the
other. Each checkout runs twice, with ``--small`` and ``--large`` requests, and
the difference is divided by the extra requests, so start-up and shutdown cancel
out::

    python benchmarks/instructions_per_request.py --base ../payonce-7ac5440
    python benchmarks/instructions_per_request.py --base ../old --kind plain

A checkout is a payonce source tree with its own ``.venv`` (``make .venv/.installed``).
``--kind keyed`` sends a new Idempotency-Key per request (the keyed first call),
``plain`` none (pass-through). Needs valgrind. About a minute per checkout.
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

BODY = json.dumps(
    {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
)


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(port: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request("GET", "/_payonce/health")
            connection.getresponse().read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def total_instructions(checkout: Path, kind: str, requests: int) -> int:
    """Instructions the gateway of ``checkout`` ran, from start to stop, for ``requests``."""
    python = str(checkout / ".venv" / "bin" / "python")
    work = Path(tempfile.mkdtemp(prefix="payonce-callgrind-"))
    sim_port, gateway_port = _port(), _port()
    sim = subprocess.Popen(
        [python, "-m", "payonce", "sim", "--port", str(sim_port), "--latency", "fixed:0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    serve = [python, "-m", "payonce", "serve", "--upstream", f"http://127.0.0.1:{sim_port}"]
    serve += ["--port", str(gateway_port), "--store", f"sqlite:///{work / 'payonce.db'}"]
    serve += ["--no-otel", "--log-level", "warning"]
    gateway = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={work}/callgrind.%p", *serve],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=work,
    )
    try:
        _wait_ready(gateway_port)
        connection = http.client.HTTPConnection("127.0.0.1", gateway_port, timeout=60)
        for _ in range(requests):
            headers = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}
            if kind == "keyed":
                headers["Idempotency-Key"] = f"k-{uuid.uuid4()}"
            connection.request("POST", "/v1/chat/completions", body=BODY, headers=headers)
            answer = connection.getresponse()
            answer.read()
            if answer.status != 200:
                raise RuntimeError(f"the gateway answered {answer.status}")
        connection.close()
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(300)
        sim.terminate()
        sim.wait()
    total = 0
    for name in glob.glob(f"{work}/callgrind.*"):
        with open(name) as handle:
            for line in handle:
                if line.startswith(("summary:", "totals:")):
                    total = max(total, int(line.split()[1]))
    return total


def per_request(checkout: Path, kind: str, small: int, large: int) -> float:
    low = total_instructions(checkout, kind, small)
    high = total_instructions(checkout, kind, large)
    return (high - low) / (large - small)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the baseline checkout")
    parser.add_argument("--new", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--kind", choices=("keyed", "plain"), default="keyed")
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=1000)
    args = parser.parse_args()
    base = per_request(args.base.resolve(), args.kind, args.small, args.large)
    new = per_request(args.new, args.kind, args.small, args.large)
    print(f"{args.kind}: base {base / 1000:,.1f}k instructions/request, new {new / 1000:,.1f}k")
    print(f"ratio new/base: {new / base:.3f}")


if __name__ == "__main__":
    main()
