"""``payonce torture``: the randomized fault checker, from the command line."""

from __future__ import annotations

import collections
import random
import sys
from pathlib import Path

import click

from payonce.config import parse_duration
from payonce.errors import ConfigError
from payonce.torture.plan import generate

__all__ = ["torture_command"]


class _ConfigExit(click.ClickException):
    exit_code = 2


@click.command()
@click.option("--seed", type=int, default=None, help="Seed of the first run (default: random).")
@click.option(
    "--store",
    type=click.Choice(["sqlite", "redis", "redis-cluster", "postgres", "memory"]),
    default="sqlite",
    show_default=True,
    help="The gateways' store (redis needs redis-server on PATH; redis-cluster, three"
    " masters, redis-cli too; postgres, a server of the run's own, Debian's postgresql).",
)
@click.option(
    "--gateways",
    type=click.IntRange(1, 3),
    default=2,
    show_default=True,
    help="How many gateways run on the one store (1 to 3).",
)
@click.option(
    "--seconds", default="20s", show_default=True, metavar="DURATION", help="Calls per run."
)
@click.option(
    "--minutes",
    type=float,
    default=0.0,
    help="Keep running new seeds for this long (0: one run).",
)
@click.option(
    "--lease",
    default="3s",
    show_default=True,
    metavar="DURATION",
    help="The gateways' --lease; faults shorter than it must bill nothing twice.",
)
@click.option(
    "--shrink",
    "shrink_budget",
    default="5m",
    show_default=True,
    metavar="DURATION",
    help="Time to spend finding a smaller failing schedule (0: none).",
)
@click.option(
    "--keep",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep every run's files (logs, call logs, ledger) under this folder.",
)
@click.option(
    "--gateway-src",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Run the gateways from this checkout's src/ (an older payonce: does the checker"
    " find its defects?); the simulator and the checks stay this version's.",
)
def torture_command(
    seed: int | None,
    store: str,
    gateways: int,
    seconds: str,
    minutes: float,
    lease: str,
    shrink_budget: str,
    keep: Path | None,
    gateway_src: Path | None,
) -> None:
    """Check the guarantee the way databases are checked: random calls and faults
    against real processes, then every invariant of docs/guarantees.md.

    Each run starts a simulator and GATEWAYS gateways on one store, sends a seeded
    mix of keyed and unkeyed calls (whole and streamed, duplicates, clients that
    leave and resume, SDK-style retries, large whole answers, upstream errors and
    deaths, several wire profiles, calls that outlive a short --ttl) while
    gateways are killed, stopped and restarted, their disk fills, and the store
    stalls. A failing
    run prints its seed, the broken invariants and a shrunk schedule; exit 1.
    """
    from payonce.torture.runner import run, shrink  # the processes' code only when run

    try:
        run_seconds = parse_duration(seconds, "--seconds")
        lease_seconds = parse_duration(lease, "--lease")
        budget = parse_duration(shrink_budget, "--shrink")
    except ConfigError as exc:
        raise _ConfigExit(str(exc)) from exc
    first = seed if seed is not None else random.SystemRandom().randrange(2**31)
    deadline_runs = minutes * 60
    import time

    began = time.monotonic()
    current = first
    runs = 0
    while True:
        plan = generate(
            current, seconds=run_seconds, store=store, gateways=gateways, lease=lease_seconds
        )
        folder = None if keep is None else keep / f"seed-{current}"
        try:
            result = run(plan, keep=folder, gateway_src=gateway_src)
        except ConfigError as exc:
            raise _ConfigExit(str(exc)) from exc
        runs += 1
        click.echo(
            f"seed {current} ({store}, {gateways} gateways): {result.calls} calls,"
            f" {len(plan.faults)} faults, {result.billed} billed,"
            f" {len(result.excused)} double bills owed to faults:"
            f" {'ok' if result.ok else f'{len(result.violations)} violations'}"
        )
        for excuse in result.excused:
            click.echo(f"  excused: {excuse}")
        if not result.ok:
            for violation in result.violations[:20]:
                click.echo(f"  {violation}", err=True)
            counts = collections.Counter(v.invariant for v in result.violations)
            click.echo(
                "  by invariant: " + ", ".join(f"{name} {n}" for name, n in counts.most_common()),
                err=True,
            )
            if budget > 0:
                small = shrink(result, budget=budget, gateway_src=gateway_src)
                click.echo(
                    f"  shrunk to {len(small.plan.calls)} calls and {len(small.plan.faults)}"
                    f" faults: {small.violations[0] if small.violations else 'passed'}",
                    err=True,
                )
            click.echo(
                f"  replay: payonce torture --seed {current} --store {store}"
                f" --gateways {gateways} --seconds {seconds} --lease {lease}"
                + (f"  (files: {result.folder})" if result.folder else ""),
                err=True,
            )
            sys.exit(1)
        if time.monotonic() - began >= deadline_runs:
            break
        current += 1
    click.echo(f"{runs} runs passed, seeds {first}..{current}")
