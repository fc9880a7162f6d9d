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

::

    python benchmarks/encryption_overhead.py                 # every kind, one round
    python benchmarks/encryption_overhead.py --kind keyed --rounds 3

Needs valgrind. About two minutes per kind and round.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from instructions_per_request import per_request
from payonce.store.sealing import new_key

KINDS = {
    "keyed": ("keyed", ()),
    "replay-store": ("replay", ("--replay-cache", "0")),
    "replay": ("replay", ()),
    "stream": ("stream", ()),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--kind", choices=sorted(KINDS), action="append")
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--large", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
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
