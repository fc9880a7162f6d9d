"""``payonce sim``: run the simulated LLM provider.

Every flag is taken as text and parsed by :meth:`SimConfig.from_flags`, so a bad
value of any flag ends the same way: one ``Error: --flag: ...`` line, exit code 2.
"""

from __future__ import annotations

import socket

import click

from payonce.errors import ConfigError
from payonce.sim.config import (
    DEFAULT_HOST,
    DEFAULT_LATENCY,
    DEFAULT_PORT,
    DEFAULT_TOKEN_RATE,
    SimConfig,
)
from payonce.sim.response_store import DEFAULT_STORED_RESPONSES

__all__ = ["sim_command"]


class _ConfigExit(click.ClickException):
    """A :class:`ConfigError` as click shows it: ``Error: <message>`` and exit code 2."""

    exit_code = ConfigError.exit_code


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="Address to listen on.")
@click.option("--port", default=str(DEFAULT_PORT), show_default=True, metavar="PORT", help="Port.")
@click.option(
    "--latency",
    default=DEFAULT_LATENCY,
    show_default=True,
    metavar="MODEL",
    help="Generation time (for a stream: time to first token): fixed:<duration> or "
    "lognormal:p50=<duration>,p99=<duration>; durations like 0, 250ms, 2s.",
)
@click.option(
    "--token-rate",
    default=DEFAULT_TOKEN_RATE,
    show_default=True,
    metavar="N/s",
    help="Streams: tokens per second, one content event each, after the --latency; "
    "0 or inf: no pacing.",
)
@click.option(
    "--fail",
    default="none",
    show_default=True,
    metavar="STATUS:RATE,...",
    help="Random failures before any work, not billed, e.g. 500:0.05,429:0.02,503:0.01.",
)
@click.option(
    "--drop-after-compute",
    default="0",
    show_default=True,
    metavar="RATE",
    help="Fraction of generations billed and then dropped without a response "
    "(a stream: without its terminating event).",
)
@click.option(
    "--die-mid-stream",
    default="0",
    show_default=True,
    metavar="RATE",
    help="Fraction of streams cut at a random event before the terminating one; not billed.",
)
@click.option(
    "--keep-alive",
    default="0",
    show_default=True,
    metavar="DURATION",
    help="Streams: send the head at once and an SSE comment (': OPENROUTER PROCESSING') "
    "after every DURATION of silence, as OpenRouter does; 0: never.",
)
@click.option(
    "--wire",
    default="openai",
    show_default=True,
    metavar="PROFILE[,VARIATION...]",
    help="Streams: frame events as this upstream does (openai, anthropic, openrouter, "
    "sse-starlette, tgi, vllm, ollama, mock-ids), with variations crlf, no-final-blank, "
    "trickle, event-bytes=N. See docs/sim.md.",
)
@click.option(
    "--stored-responses",
    default=str(DEFAULT_STORED_RESPONSES),
    show_default=True,
    metavar="N",
    help="Responses API: how many responses GET /v1/responses/{id} can read back "
    "(the oldest are evicted; 0: none).",
)
@click.option("--seed", default=None, metavar="N", help="Seed for repeatable runs.")
@click.option(
    "--ledger",
    default=None,
    metavar="FILE",
    help="Also append every billed generation to this CSV file (a billing export).",
)
@click.option(
    "--listen-fd",
    type=int,
    default=None,
    # For `payonce serve --upstream sim`, which binds --sim-port itself so that
    # no other program can be mistaken for its simulator (payonce/listening.py).
    hidden=True,
)
def sim_command(
    host: str,
    port: str,
    latency: str,
    token_rate: str,
    fail: str,
    drop_after_compute: str,
    die_mid_stream: str,
    keep_alive: str,
    wire: str,
    stored_responses: str,
    seed: str | None,
    ledger: str | None,
    listen_fd: int | None,
) -> None:
    """Run a simulated LLM provider (OpenAI and Anthropic APIs) that bills like a real one.

    Every generation that finishes is billed, even when the client has gone; read the
    bill at GET /_sim/ledger.

    \b
    Per-request headers: X-Sim-Delay-Ms, X-Sim-Fail, X-Sim-Drop, X-Sim-No-Request-Id;
    for streams ("stream": true): X-Sim-Token-Ms, X-Sim-Die-After, X-Sim-Keep-Alive-Ms,
    X-Sim-Wire.
    """
    try:
        config = SimConfig.from_flags(
            host=host,
            port=port,
            latency=latency,
            fail=fail,
            drop_after_compute=drop_after_compute,
            seed=seed,
            ledger=ledger,
            token_rate=token_rate,
            die_mid_stream=die_mid_stream,
            stored_responses=stored_responses,
            keep_alive=keep_alive,
            wire=wire,
        )
        # Imported here so that `payonce --help` and other commands do not pay for
        # importing aiohttp.
        from payonce.sim.server import run

        run(config, None if listen_fd is None else [socket.socket(fileno=listen_fd)])
    except ConfigError as exc:
        raise _ConfigExit(str(exc)) from exc
