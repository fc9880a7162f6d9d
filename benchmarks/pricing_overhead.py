"""What pricing adds to the keyed first call: instructions per request under callgrind,
the same checkout with and without pricing, alternating in one run (issue 34).

"Without" runs the gateway with a ``sitecustomize`` that replaces
``payonce.observe.pricing.priced`` and ``priced_call`` (what the gateway calls: the
price, and the list price beside a stated cost) by ones that price nothing (before
any gateway module imports them), so the difference is the price lookup and arithmetic per call,
and the import of genai-prices' database, which start-up and shutdown cancel out
of (``instructions_per_request.per_request`` divides the difference of a small
and a large run)::

    python -m benchmarks.pricing_overhead --rounds 2
    python -m benchmarks.pricing_overhead --kind keyed,replay --call-log

Needs valgrind and a checkout with its ``.venv`` (``--checkout``, default this one).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from benchmarks.instructions_per_request import KINDS, per_request

SHIM = """
import payonce.observe.pricing as pricing

def priced(model, usage):
    return None, None

def priced_call(model, usage):
    return None, None, None

pricing.priced = priced
pricing.priced_call = priced_call
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--kind", default="keyed", help=f"{', '.join(KINDS)} (comma-separated)")
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=1000)
    parser.add_argument("--call-log", action="store_true", help="with a call log file")
    parser.add_argument("--rounds", type=int, default=1, help="with and without, alternating")
    args = parser.parse_args()
    shim = Path(tempfile.mkdtemp(prefix="payonce-no-pricing-"))
    (shim / "sitecustomize.py").write_text(SHIM)
    path = os.environ.get("PYTHONPATH", "")
    without = {"PYTHONPATH": os.pathsep.join(p for p in (str(shim), path) if p)}
    for round_ in range(1, args.rounds + 1):
        for kind in (k.strip() for k in args.kind.split(",") if k.strip()):
            options = (kind, args.small, args.large, 1, args.call_log)
            off = per_request(args.checkout.resolve(), *options, (), without)
            on = per_request(args.checkout.resolve(), *options)
            print(
                f"{kind}{', --call-log' if args.call_log else ''}, round {round_}:"
                f" without pricing {off['total'] / 1000:,.1f}k instructions/request,"
                f" with {on['total'] / 1000:,.1f}k, ratio {on['total'] / off['total']:.4f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
