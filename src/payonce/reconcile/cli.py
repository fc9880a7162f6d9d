"""``payonce reconcile``: join call logs with bills, print the figures, alert.

DuckDB and rich are imported when the command runs, not when the CLI starts:
they come with the ``reconcile`` extra (``pip install 'payonce[reconcile]'``),
and the gateway does not need them.

Exit codes: 0 figures within the thresholds, 1 an error (the webhook could not
be posted, out of memory), 2 bad input (flag, missing file or column),
3 a threshold was exceeded.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from payonce.errors import ConfigError
from payonce.extras import require_extra

__all__ = ["reconcile_command"]

_MULTI_VALUE = ("--calls", "--bill")


class _ReconcileCommand(click.Command):
    """Lets ``--calls a.jsonl b.jsonl`` (a shell glob) mean ``--calls a.jsonl --calls b.jsonl``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, spread_multi_value(args))


def spread_multi_value(args: Sequence[str]) -> list[str]:
    """Repeat ``--calls``/``--bill`` before each value that follows it."""
    result: list[str] = []
    current: str | None = None
    for arg in args:
        if arg in _MULTI_VALUE:
            current = arg
            result.append(arg)
            continue
        if arg.startswith("-") and arg != "-":
            current = None
        elif current is not None and result[-1] != current:
            result.append(current)
        result.append(arg)
    return result


def _fraction(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise click.BadParameter(f"expected a number, got {value!r}") from None
    if number < 0:
        raise click.BadParameter("must not be negative")
    return number


@click.command(cls=_ReconcileCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--calls",
    "calls",
    multiple=True,
    required=True,
    type=click.Path(path_type=Path),
    metavar="FILE...",
    help="Call logs: payonce JSONL (gzip accepted, rotated files too) or the generic schema.",
)
@click.option(
    "--bill",
    "bills",
    multiple=True,
    type=click.Path(path_type=Path),
    metavar="FILE...",
    help="Bills: the simulator's ledger CSV, LiteLLM spend logs, Bedrock invocation logs,"
    " OpenRouter generations, Azure APIM LLM logs, the generic schema; or OpenAI/Anthropic"
    " usage and cost reports (compared bucket by bucket).",
)
# --fetch: the admin usage and cost reports, pulled with OPENAI_ADMIN_KEY /
# ANTHROPIC_ADMIN_KEY (never a flag) and added to the bills (reconcile/fetch.py).
@click.option(
    "--fetch",
    type=click.Choice(["openai", "anthropic"]),
    help="Fetch the provider's usage and cost reports with the admin key in"
    " OPENAI_ADMIN_KEY / ANTHROPIC_ADMIN_KEY, and add them to the bills.",
)
@click.option(
    "--since", metavar="DATE", help="With --fetch (required): from this ISO date or time, UTC."
)
@click.option(
    "--until", metavar="DATE", help="With --fetch: up to this ISO date or time (default: now)."
)
@click.option(
    "--fetch-url",
    metavar="URL",
    help="With --fetch: the API's base URL (default https://api.openai.com or"
    " https://api.anthropic.com); a payonce sim URL to rehearse.",
)
@click.option(
    "--bucket-width",
    type=click.Choice(["1m", "1h", "1d"]),
    help="With --fetch: the usage report's buckets (default 1h; the costs are daily).",
)
@click.option(
    "--save",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help="With --fetch: keep the fetched pages in DIR (default: a temporary directory, removed).",
)
@click.option(
    "--calls-format",
    type=click.Choice(["auto", "payonce", "generic"]),
    default="auto",
    show_default=True,
    help="The call log's format: payonce's JSON lines, or generic CSV/JSON"
    " (auto: from its content).",
)
@click.option(
    "--bill-format",
    type=click.Choice(
        [
            "auto",
            "ledger",
            "litellm",
            "bedrock-invocations",
            "openrouter-generations",
            "azure-apim-llm",
            "openai-usage",
            "openai-costs",
            "anthropic-usage",
            "anthropic-costs",
            "generic",
        ]
    ),
    default="auto",
    show_default=True,
    help="The bill's format: a provider's or gateway's export (auto: from its content).",
)
@click.option(
    "--calls-map",
    metavar="FIELD=COLUMN,...",
    help="Read call fields from other columns: business_id=order_id,tag=team.",
)
@click.option(
    "--bill-map",
    metavar="FIELD=COLUMN,...",
    help="Read bill fields from other columns: provider_request_id=req_id,cost_usd=amount.",
)
@click.option("--json", "json_path", metavar="FILE", help="Write the JSON summary (- for stdout).")
@click.option("--html", "html_path", type=click.Path(path_type=Path), help="Write the HTML report.")
@click.option(
    "--max-duplicate-ratio",
    metavar="RATIO",
    help="Exit 3 when duplicate generations / billed generations is above this (0.02 = 2%).",
)
@click.option(
    "--max-cost-per-call",
    metavar="USD",
    help="Exit 3 when the cost per successful business call is above this.",
)
@click.option(
    "--max-unexplained-cost",
    metavar="USD",
    help="Exit 3 when spend nothing in the call log explains is above this (usage reports:"
    " unexplained cost; request-id bills: unmatched spend).",
)
@click.option(
    "--key-map",
    type=click.Path(path_type=Path),
    metavar="FILE",
    help="Usage reports: JSON object from tenant id (payonce tenant-id) to the provider's"
    " API key id or project id, to compare each key with its tenants' calls.",
)
@click.option(
    "--token-tolerance",
    default="0.01",
    show_default=True,
    metavar="RATIO",
    help="Usage reports: a bucket whose billed and logged tokens differ by more than this"
    " share of the billed ones is flagged, and only then are they unexplained.",
)
@click.option("--webhook", metavar="URL", help="POST the JSON summary to this URL.")
@click.option(
    "--webhook-on",
    type=click.Choice(["always", "alert"]),
    default="always",
    show_default=True,
    help="Post on every run, or only when a threshold is exceeded.",
)
@click.option(
    "--outlier-factor",
    default="5",
    show_default=True,
    metavar="N",
    help="A generation above N x its model's median cost is an outlier.",
)
@click.option(
    "--memory-limit",
    default="3GiB",
    show_default=True,
    help="DuckDB memory limit; beyond it, work spills to --temp-dir.",
)
@click.option(
    "--temp-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where DuckDB spills (default: a fresh temporary directory).",
)
@click.option("--threads", type=click.IntRange(min=1), help="DuckDB threads (default: all cores).")
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar (default: on a terminal, for inputs over 64 MiB).",
)
@click.option("--quiet", "-q", is_flag=True, help="No terminal summary (alerts still print).")
def reconcile_command(**options: Any) -> None:
    """Join call logs with a provider's bill: duplicates, waste, cost per successful call.

    \b
    payonce reconcile --calls calls.jsonl* --bill ledger.csv --json out.json --html out.html
    payonce reconcile --calls log.jsonl.gz --bill spend_logs.csv --max-duplicate-ratio 0.02
    payonce reconcile --calls calls.jsonl --fetch openai --since 2026-11-01   # OPENAI_ADMIN_KEY
    """
    require_extra("reconcile", "reconcile")
    from payonce.reconcile.main import run_command

    sys.exit(run_command(options))


def write_json(path: str, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` (``-``: stdout)."""
    text = json.dumps(document, indent=2, default=str) + "\n"
    if path == "-":
        sys.stdout.write(text)
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--json: cannot write {path!r}: {exc.strerror}") from exc


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def parse_threshold(flag: str, value: str | None) -> float | None:
    """A threshold flag's number (None when not given); bad values exit 2."""
    if value is None:
        return None
    try:
        return _fraction(value)
    except click.BadParameter as exc:
        raise ConfigError(f"{flag}: {exc.message}") from None
