"""``payonce simulate``: what a timeout and retry configuration costs, with no network.

Every flag is taken as text and parsed into a :class:`~payonce.simulate.config.StackConfig`,
so a bad value of any flag ends the same way: one line naming the flag, exit code 2.
NumPy and rich are imported when the command runs: they come with the ``simulate``
extra (``pip install 'payonce[simulate]'``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from payonce.config import parse_duration
from payonce.errors import ConfigError
from payonce.extras import require_extra

if TYPE_CHECKING:
    from payonce.simulate.config import StackConfig

__all__ = ["simulate_command"]

DEFAULT_LATENCY = "lognormal:p50=4s,p99=30s"
# nginx's proxy_read_timeout default, for a proxy given only --proxy-retries.
DEFAULT_PROXY_TIMEOUT = "60s"
MAX_REQUESTS = 10_000_000
_RETRY_ON = click.Choice(["timeout", "5xx", "both", "none"])


class _ConfigExit(click.ClickException):
    """A :class:`ConfigError` as click shows it: one line and exit code 2."""

    exit_code = ConfigError.exit_code


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--latency",
    default=DEFAULT_LATENCY,
    show_default=True,
    metavar="MODEL",
    help="Generation time: fixed:<duration>, lognormal:p50=<duration>,p99=<duration> (as"
    " payonce sim), or empirical:FILE (seconds per line, or a payonce call log).",
)
@click.option(
    "--timeout",
    default="600s",
    show_default=True,
    metavar="DURATION",
    help="The SDK's read timeout per attempt (openai's default is 600s).",
)
@click.option(
    "--connect-timeout",
    default="5s",
    show_default=True,
    metavar="DURATION",
    help="How long an attempt whose connection cannot be made waits before it fails.",
)
@click.option(
    "--connect-fail",
    default="0",
    show_default=True,
    metavar="RATE",
    help="Share of attempts whose connection cannot be made: each waits --connect-timeout,"
    " bills nothing, and counts as a timeout.",
)
@click.option(
    "--app-attempts",
    default="1",
    show_default=True,
    metavar="N",
    help="How many times the application's own loop calls the SDK per business request.",
)
@click.option(
    "--app-backoff",
    default="0",
    show_default=True,
    metavar="BACKOFF",
    help="Wait before an application retry: a duration, sdk, none, or"
    " exp:initial=..,max=..,jitter=...",
)
@click.option(
    "--app-retry-on",
    type=_RETRY_ON,
    default="timeout",
    show_default=True,
    help="The failures the application's loop retries.",
)
@click.option(
    "--sdk-retries",
    default="2",
    show_default=True,
    metavar="N",
    help="The SDK's retries per call (max_retries: 2 is 3 attempts).",
)
@click.option(
    "--sdk-backoff",
    default="sdk",
    show_default=True,
    metavar="BACKOFF",
    help="sdk: min(0.5 * 2**n, 8) s less up to 25% jitter, as the openai SDK; or a"
    " duration, none, exp:initial=..,max=..,jitter=...",
)
@click.option(
    "--sdk-retry-on",
    type=_RETRY_ON,
    default="both",
    show_default=True,
    help="The failures the SDK retries (the openai SDK: timeouts and 5xx, both).",
)
@click.option(
    "--proxy-timeout",
    default=None,
    metavar="DURATION",
    help="A retrying proxy below the SDK (nginx proxy_next_upstream timeout): how long"
    " each try waits. No proxy unless this or --proxy-retries is given.",
)
@click.option("--proxy-retries", default=None, metavar="N", help="The proxy's extra tries [0].")
@click.option(
    "--proxy-retry-on",
    type=_RETRY_ON,
    default="timeout",
    show_default=True,
    help="The failures the proxy tries again (5xx or both: a 5xx answer is re-sent at once).",
)
@click.option(
    "--proxy-below-payonce",
    is_flag=True,
    help="With payonce: the proxy sits between the gateway and the provider (its retries"
    " still bill), not above the gateway.",
)
@click.option(
    "--payonce",
    is_flag=True,
    help="Report the stack with payonce (one generation per idempotency key).",
)
@click.option(
    "--fail",
    default="0",
    show_default=True,
    metavar="RATE",
    help="Share of provider calls answered 5xx at once, before any work (not billed).",
)
@click.option(
    "--deadline",
    default=None,
    metavar="DURATION",
    help="The application's overall deadline per business request.",
)
@click.option(
    "--requests",
    default="1000000",
    show_default=True,
    metavar="N",
    help="Business requests to simulate (at most 10,000,000).",
)
@click.option(
    "--price-per-call",
    default="0.01",
    show_default=True,
    metavar="USD",
    help="Price of one generation, for the money wasted.",
)
@click.option(
    "--target-false-timeouts",
    default="0.01",
    show_default=True,
    metavar="RATE",
    help="The recommended timeout keeps false timeouts at or below this share.",
)
@click.option("--seed", default=None, metavar="N", help="Seed for repeatable runs.")
@click.option(
    "--json",
    "json_path",
    is_flag=False,
    flag_value="-",
    default=None,
    metavar="[FILE]",
    help="Write the figures as JSON to FILE, or to stdout (instead of the table) when no"
    " FILE or - is given.",
)
@click.option(
    "--html",
    "html_path",
    default=None,
    metavar="FILE",
    help="Write a page with the duplicate ratio and the success rate against the client"
    " timeout, with and without payonce.",
)
@click.option(
    "--plot-requests",
    default="20000",
    show_default=True,
    metavar="N",
    help="Business requests per point of the --html charts.",
)
def simulate_command(**options: Any) -> None:
    """Estimate what retries cost: billed generations, duplicates, success, latency.

    A Monte Carlo of the stack application loop -> SDK -> [proxy] -> [payonce] ->
    provider, where every generation that starts is billed (docs/simulate.md).

    \b
    payonce simulate --latency lognormal:p50=4s,p99=30s --timeout 10s --app-attempts 2 \\
        --app-backoff 300ms --sdk-retries 2 --proxy-timeout 8s --proxy-retries 1
    """
    try:
        _run(options)
    except ConfigError as exc:
        raise _ConfigExit(str(exc)) from exc


def _run(options: dict[str, Any]) -> None:
    require_extra("simulate", "simulate")
    from rich.console import Console

    from payonce.simulate.report import run_report
    from payonce.simulate.terminal import render

    stack = build_stack(options)
    requests = _count(options["requests"], "--requests", minimum=1)
    if requests > MAX_REQUESTS:
        # About 200 bytes of arrays per request (1 GB for 5M): memory, not time, is the limit.
        raise ConfigError(f"--requests: at most {MAX_REQUESTS:,} (each takes ~200 bytes of memory)")
    plot_requests = _count(options["plot_requests"], "--plot-requests", minimum=1)
    seed = None if options["seed"] is None else _count(options["seed"], "--seed", minimum=0)
    price = _number(options["price_per_call"], "--price-per-call")
    target = _fraction(options["target_false_timeouts"], "--target-false-timeouts")
    if not 0 < target < 1:
        raise ConfigError("--target-false-timeouts: must be between 0 and 1 (0.01 = 1%)")
    report = run_report(
        stack, requests, seed=seed, price_per_call=price, target_false_timeouts=target
    )
    json_path: str | None = options["json_path"]
    if json_path != "-":
        render(report, Console(highlight=False))
    if json_path is not None:
        _write(json_path, json.dumps(report.to_json(), indent=2) + "\n", "--json")
    html_path: str | None = options["html_path"]
    if html_path is not None:
        from payonce.simulate.html import render_html
        from payonce.simulate.sweep import sweep

        points = sweep(stack, report.recommended_timeout_s, requests=plot_requests, seed=seed)
        _write(html_path, render_html(report, points), "--html")


def build_stack(options: dict[str, Any]) -> StackConfig:
    """The :class:`StackConfig` the flags describe (``options`` as click passes them)."""
    from payonce.simulate.config import ProxyConfig, RetryOn, StackConfig, parse_backoff
    from payonce.simulate.latency import parse_distribution

    proxy = None
    if options["proxy_timeout"] is not None or options["proxy_retries"] is not None:
        proxy = ProxyConfig(
            timeout=_duration(options["proxy_timeout"] or DEFAULT_PROXY_TIMEOUT, "--proxy-timeout"),
            retries=_count(options["proxy_retries"] or "0", "--proxy-retries", minimum=0),
            retry_on=RetryOn(options["proxy_retry_on"]),
        )
    elif options["proxy_below_payonce"]:
        raise ConfigError("--proxy-below-payonce: there is no proxy (give --proxy-timeout)")
    deadline = options["deadline"]
    return StackConfig(
        latency=parse_distribution(options["latency"]),
        timeout=_duration(options["timeout"], "--timeout"),
        connect_timeout=_duration(options["connect_timeout"], "--connect-timeout"),
        connect_failure_rate=_fraction(options["connect_fail"], "--connect-fail"),
        app_attempts=_count(options["app_attempts"], "--app-attempts", minimum=1),
        app_backoff=parse_backoff(options["app_backoff"], flag="--app-backoff"),
        app_retry_on=RetryOn(options["app_retry_on"]),
        sdk_retries=_count(options["sdk_retries"], "--sdk-retries", minimum=0),
        sdk_backoff=parse_backoff(options["sdk_backoff"], flag="--sdk-backoff"),
        sdk_retry_on=RetryOn(options["sdk_retry_on"]),
        proxy=proxy,
        payonce=options["payonce"],
        proxy_below_payonce=options["proxy_below_payonce"],
        failure_rate=_fraction(options["fail"], "--fail"),
        deadline=None if deadline is None else _duration(deadline, "--deadline"),
    )


def _duration(text: str, flag: str) -> float:
    seconds = parse_duration(text, flag)
    if seconds <= 0:
        raise ConfigError(f"{flag}: must be more than 0")
    return seconds


def _count(text: str, flag: str, *, minimum: int) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} is not a whole number") from None
    if value < minimum:
        raise ConfigError(f"{flag}: must be at least {minimum}, got {value}")
    return value


def _number(text: str, flag: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{flag}: {text!r} is not a number") from None
    if not (value >= 0 and value != float("inf")):
        raise ConfigError(f"{flag}: must be a finite number >= 0")
    return value


def _fraction(text: str, flag: str) -> float:
    from payonce.simulate.config import parse_rate

    return parse_rate(text, flag=flag)


def _write(path: str, text: str, flag: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot write {path!r}: {exc.strerror}") from exc
