"""Instructions per request with and without encryption at rest, same checkout, same run.

The machinery of ``instructions_per_request.py`` (callgrind, a small and a large
run whose difference cancels start-up and shutdown), run twice per kind of
request: without ``PAYONCE_ENCRYPTION_KEY`` (the baseline) and with one. Kinds:

* ``keyed``: the keyed first call (claim, upstream call, body and headers sealed);
* ``replay-store``: a replay read from the store (``--replay-cache 0``: what a
  restarted gateway, another worker or another replica does), opened;
* ``replay``: a replay as it usually is, from the in-process replay cache
  (nothing to decrypt: expected equal);
* ``stream``: a keyed streamed first call (each event sealed).

``--codec`` measures the codec alone instead, in-process: instructions per call of
sealing and opening one 405-byte response with 3 headers, against the plain form
(callgrind over N calls and over none, subtracted).

::

    python benchmarks/encryption_overhead.py                 # every kind, one round
    python benchmarks/encryption_overhead.py --kind keyed --rounds 3
    python benchmarks/encryption_overhead.py --codec

Needs valgrind. About two minutes per kind and round; ``--codec`` about one.
"""

from __future__ import annotations

import argparse
import glob
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from instructions_per_request import per_request
from payonce.store.base import StoredResponse
from payonce.store.sealing import PLAIN, Sealing, new_key, parse_keys

KINDS = {
    "keyed": ("keyed", ()),
    "replay-store": ("replay", ("--replay-cache", "0")),
    "replay": ("replay", ()),
    "stream": ("stream", ()),
}


CODEC_CALLS = ("seal", "plain-out", "open", "plain-open")


def _codec_call(name: str) -> Callable[[], object]:
    sealing = Sealing(parse_keys(new_key(), "key"))
    headers = (
        ("content-type", "application/json"),
        ("x-request-id", "chatcmpl-4e29b7f95c8d36615f55cc79"),
        ("content-length", "405"),
    )
    response = StoredResponse(200, headers, b"x" * 405)
    tenant, key = "t" * 32, "order-123"
    sealed = sealing.response_out(tenant, key, response)
    plain = PLAIN.response_out(tenant, key, response)
    return {
        "seal": lambda: sealing.response_out(tenant, key, response),
        "plain-out": lambda: PLAIN.response_out(tenant, key, response),
        "open": lambda: sealing.response_in(tenant, key, 200, *sealed, False),
        "plain-open": lambda: PLAIN.response_in(tenant, key, 200, *plain, False),
    }[name]


def _instructions(name: str, calls: int) -> int:
    with tempfile.TemporaryDirectory() as work:
        command = [sys.executable, __file__, "--codec-run", name, str(calls)]
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={work}/cg", *command],
            check=True,
            capture_output=True,
        )
        (out,) = glob.glob(f"{work}/cg")
        for line in Path(out).read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError("no totals in the callgrind output")


def codec(calls: int = 2000) -> None:
    """Instructions per call of the codec alone, for each of CODEC_CALLS."""
    for name in CODEC_CALLS:
        per_call = (_instructions(name, calls) - _instructions(name, 0)) / calls
        print(f"codec {name}: {per_call / 1000:,.1f}k instructions/call", flush=True)


def main() -> None:
    if sys.argv[1:2] == ["--codec-run"]:  # the process callgrind watches
        call = _codec_call(sys.argv[2])
        for _ in range(int(sys.argv[3])):
            call()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--kind", choices=sorted(KINDS), action="append")
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--large", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--codec", action="store_true", help="the codec alone, in-process")
    args = parser.parse_args()
    if args.codec:
        codec()
        return
    key = new_key()
    for round_ in range(1, args.rounds + 1):
        for name in args.kind or list(KINDS):
            kind, flags = KINDS[name]
            runs = {}
            for label, value in (("plain", None), ("sealed", key)):
                env = {"PAYONCE_ENCRYPTION_KEY": value}
                runs[label] = per_request(
                    args.checkout, kind, args.small, args.large, flags=flags, env=env
                )["total"]
            plain, sealed = runs["plain"], runs["sealed"]
            print(
                f"{name}, round {round_}: without a key {plain / 1000:,.1f}k instructions/request,"
                f" with one {sealed / 1000:,.1f}k (+{(sealed - plain) / 1000:,.1f}k),"
                f" ratio {sealed / plain:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
