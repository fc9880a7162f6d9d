"""``payonce demo``: run the stacks of :mod:`payonce.demo.runs` and print one table."""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from payonce.errors import ConfigError
from payonce.extras import require_extra

if TYPE_CHECKING:
    from payonce.demo.figures import RunFigures
    from payonce.demo.runs import DemoConfig, RunResult

__all__ = ["demo_command"]

_EXPLAIN = """\
A  the official openai SDK (max_retries=2, 10 s timeout) in an application loop
   that retries once after a timeout, through a proxy that re-sends a request
   the provider has not answered within 8 s (an anti-pattern: nginx's
   proxy_next_upstream timeout does this). Every re-sent request is billed.
B  the same application and SDK, one Idempotency-Key per business request,
   through payonce.
C  the incident report's mitigation: no retries anywhere, a 30 s timeout.
D  payonce above that retrying proxy: payonce only sees its own upstream calls,
   so the proxy's re-sends bill again. payonce must be the last hop before the
   provider (payonce lint flags retrying nginx, Envoy and LiteLLM configs).
E  run A's application, SDK and proxy, unchanged and sending no key, with
   payonce --dedupe-identical between the proxy and the provider: the SDK's
   retries are matched, the application's and the proxy's re-sends deduplicated.
Latencies are in the incident's time: the demo ran at --time-scale."""


def _run(work: Coroutine[Any, Any, list[RunResult]]) -> list[RunResult]:
    # uvloop, as the gateway: the application's SDK calls are CPU-bound on a small
    # machine, and what the client spends on its own adds to every user latency.
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.run(work)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(work)


def _usd(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"${value:,.{digits}f}"


def _table(rows: list[RunFigures]) -> Any:
    from rich.table import Table

    requests = rows[0].business_requests if rows else 0
    table = Table(title=f"{requests:,} business requests through each stack")
    for header in ("run", "billed", "duplicates", "spent", "wasted", "$ per success",
                   "success", "p50", "p99"):  # fmt: skip
        table.add_column(header, justify="left" if header == "run" else "right")
    for row in rows:
        table.add_row(
            f"{row.run} {row.title}",
            f"{row.billed_generations:,}",
            f"{row.duplicate_ratio:.1%}",
            _usd(row.cost_usd),
            _usd(row.wasted_usd),
            _usd(row.cost_per_success_usd, 5),
            f"{row.success_rate:.1%}",
            f"{row.latency_p50_s:.1f} s",
            f"{row.latency_p99_s:.1f} s",
        )
    return table


def _reconcile(result: RunResult) -> tuple[Path, str]:
    """Write the run's reconcile HTML report; return it and the command that makes it."""
    from payonce.reconcile.html import render_html
    from payonce.reconcile.report import Report
    from payonce.reconcile.run import reconcile

    report = reconcile([result.calls], [result.folder / "ledger.csv"])
    if not isinstance(report, Report):  # pragma: no cover - a ledger is joined by request id
        raise TypeError("the simulator's ledger gave a usage report")
    html = result.folder / "reconcile.html"
    html.write_text(render_html(report, ()), encoding="utf-8")
    command = shlex.join(
        [*_payonce_command(), "reconcile", "--calls", str(result.calls), "--bill",
         str(result.folder / "ledger.csv"), "--html", str(html)]
    )  # fmt: skip
    return html, command


def _payonce_command() -> list[str]:
    """How to run this same payonce from the same directory, as the user would type it.

    ``payonce`` when that name on PATH is the program running now; the path it was
    started by otherwise (``.venv/bin/payonce`` after ``make demo``, which puts
    nothing on PATH); ``<python> -m payonce`` when it was started that way.
    """
    started = Path(sys.argv[0])
    if started.name != "payonce":  # python -m payonce (argv[0] is its __main__.py)
        return [sys.executable, "-m", "payonce"]
    on_path = shutil.which("payonce")
    if on_path is not None and Path(on_path).resolve() == started.resolve():
        return ["payonce"]
    return [str(started)]


async def _run_all(config: DemoConfig, show_progress: bool) -> list[RunResult]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from payonce.demo.runs import RUNS, run_one

    results = []
    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, disable=not show_progress, transient=False) as progress:
        for name in config.runs:
            spec = RUNS[name]
            task = progress.add_task(f"run {name}: {spec.title}", total=config.requests)
            results.append(
                await run_one(spec, config, lambda task=task: progress.advance(task))  # type: ignore[misc]
            )
    return results


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--requests", type=click.IntRange(1, 1_000_000), default=1000, show_default=True,
              help="Business requests in each run.")  # fmt: skip
@click.option("--time-scale", type=click.FloatRange(0.01, 1.0), default=0.1, show_default=True,
              help="Every duration times this (0.1: a 10 s timeout lasts 1 s).")  # fmt: skip
@click.option("--runs", default="A,B,C,D,E", show_default=True, help="Which runs, e.g. A,B.")
@click.option("--seed", type=int, default=7, show_default=True, help="The provider's seed.")
@click.option("--fail-rate", type=click.FloatRange(0, 0.5), default=0.01, show_default=True,
              help="Share of provider calls answered 500 before any work.")  # fmt: skip
@click.option("--concurrency", type=click.IntRange(1, 1000), default=50, show_default=True,
              help="Business requests in flight at once.")  # fmt: skip
@click.option("--output", type=click.Path(path_type=Path, file_okay=False), default="payonce-demo",
              show_default=True, help="Folder for the call logs, ledgers and reports.")  # fmt: skip
@click.option("--json", "json_path", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the figures as JSON (- for stdout).")  # fmt: skip
@click.option(
    "--progress/--no-progress", default=None, help="Progress bars (default: on a terminal)."
)
def demo_command(**options: Any) -> None:
    """Replay the retry double-billing incident: five stacks, the same requests, one bill each.

    The incident: an LLM team found 31% of its bill was duplicate generations from
    stacked retries (client timeouts, the SDK's max_retries, a gateway's retries),
    because providers bill when inference finishes, not when the response arrives
    (docs/design.md, "The incident").

    Real processes on free local ports: the simulated provider (lognormal latency,
    p50 4 s, p99 30 s), a retrying proxy, the payonce gateway, and the official
    openai SDK in an application retry loop. No API key, no network.
    """
    # Before anything runs (payonce/extras.py); and imported here, not at the top:
    # the demo pulls in the openai SDK, which no other command needs.
    require_extra("demo", "demo")
    from payonce.demo.figures import figures_of
    from payonce.demo.runs import RUNS, DemoConfig

    runs = tuple(part.strip().upper() for part in options["runs"].split(",") if part.strip())
    unknown = [name for name in runs if name not in RUNS]
    if unknown or not runs:
        raise ConfigError(f"--runs: {options['runs']!r}: choose among A, B, C, D, E")
    config = DemoConfig(
        requests=options["requests"],
        time_scale=options["time_scale"],
        fail_rate=options["fail_rate"],
        concurrency=options["concurrency"],
        seed=options["seed"],
        runs=runs,
        output=options["output"],
    )
    show = options["progress"] if options["progress"] is not None else sys.stderr.isatty()
    results = _run(_run_all(config, show))
    rows = [figures_of(result, config.time_scale) for result in results]
    from rich.console import Console

    to_stderr = options["json_path"] == Path("-")
    stream = sys.stderr if to_stderr else sys.stdout
    # Piped into a file or a pager, rich would wrap the table at 80 columns.
    console = Console(stderr=to_stderr, width=None if stream.isatty() else 110)
    console.print(_table(rows))
    console.print(_EXPLAIN, highlight=False)
    console.print("Reproduce the figures from the files:", highlight=False)
    for result in results:
        _, command = _reconcile(result)
        console.print(f"  {command}", highlight=False, soft_wrap=True)
    if options["json_path"] is not None:
        document = {
            "config": {
                "requests": config.requests,
                "time_scale": config.time_scale,
                "seed": config.seed,
                "fail_rate": config.fail_rate,
                "latency": f"lognormal:p50={config.latency_p50}s,p99={config.latency_p99}s",
            },
            "runs": {row.run: row.as_dict() for row in rows},
        }
        text = json.dumps(document, indent=2)
        if options["json_path"] == Path("-"):
            click.echo(text)
        else:
            options["json_path"].write_text(text + "\n", encoding="utf-8")
