"""The ``payonce`` command line: the only module that wires the parts together.

Errors in flags, ``PAYONCE_*`` variables or the config file end the command with
one line on stderr and exit code 2; nothing prints a traceback for bad input.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from payonce import __version__
from payonce.config import GatewaySettings, load_toml, parse_duration, parse_size
from payonce.errors import ConfigError, PayonceError

__all__ = ["cli", "main"]


class Duration(click.ParamType[float]):
    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            return parse_duration(value, _flag(param))
        except ConfigError as exc:
            self.fail(str(exc).split(": ", 1)[-1], param, ctx)


class Size(click.ParamType[int]):
    name = "size"

    def __init__(self, *, allow_zero: bool = False) -> None:
        self.allow_zero = allow_zero

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            return parse_size(value, _flag(param), allow_zero=self.allow_zero)
        except ConfigError as exc:
            self.fail(str(exc).split(": ", 1)[-1], param, ctx)


def _flag(param: click.Parameter | None) -> str:
    return f"--{param.name.replace('_', '-')}" if param and param.name else "value"


def _load_config(ctx: click.Context, _param: click.Parameter, path: str | None) -> None:
    # Eager, so the file's values become defaults that env vars and flags override.
    if path:
        values = load_toml(path)
        for param in ctx.command.params:
            # A repeatable option may be one string in the file ("x-a, x-b").
            if getattr(param, "multiple", False) and isinstance(values.get(param.name), str):
                values[str(param.name)] = [values[str(param.name)]]
            # Or a table of NAME=VALUE pairs ([credential-scenario]).
            if getattr(param, "multiple", False) and isinstance(values.get(param.name), dict):
                table = values[str(param.name)]
                values[str(param.name)] = [f"{key}={value}" for key, value in table.items()]
        ctx.default_map = {**(ctx.default_map or {}), **values}


def _env(name: str) -> str:
    return "PAYONCE_" + name.upper()


def _env_only(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if (
        value is not None
        and ctx.get_parameter_source(str(param.name)) is ParameterSource.COMMANDLINE
    ):
        raise click.BadParameter(
            "a key on the command line shows in the process list: set PAYONCE_ENCRYPTION_KEY"
            " instead, or name a file of keys with --encryption-key-file",
            ctx,
            param,
        )
    return value


def _installed_version() -> str:
    """The version of the distribution this ``payonce`` package was installed from.

    Read from the package metadata when this very file belongs to it (a wheel or
    sdist install); an editable install or a source tree on ``PYTHONPATH`` may have
    metadata older than its code, so there ``payonce.__version__`` answers.
    """
    try:
        dist = importlib.metadata.distribution("payonce")
    except importlib.metadata.PackageNotFoundError:
        return __version__
    here = Path(__file__).resolve()
    for file in dist.files or ():
        if file.name == "cli.py" and Path(str(dist.locate_file(file))).resolve() == here:
            return dist.version
    return __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    version=_installed_version(), prog_name="payonce", message="%(prog)s %(version)s"
)
def cli() -> None:
    """payonce: make a retried LLM API call cost the same as one call."""


@cli.command("serve")
@click.option(
    "--config",
    type=click.Path(dir_okay=False),
    envvar=_env("config"),
    is_eager=True,
    expose_value=False,
    callback=_load_config,
    help="TOML file of settings (flat, or under [serve]); flags and env vars win.",
)
@click.option(
    "--upstream",
    envvar=_env("upstream"),
    default="sim",
    show_default=True,
    help="Base URL of the LLM API (https://api.openai.com, http://vllm:8000), or 'sim'"
    " to start the simulated provider.",
)
@click.option(
    "--store",
    envvar=_env("store"),
    default="sqlite:///./payonce.db",
    show_default=True,
    help="memory://, sqlite:///path.db, redis://host:port/db, redis+cluster://host:port"
    " or postgresql://user@host:port/db (password: PAYONCE_STORE_PASSWORD or ~/.pgpass)",
)
@click.option(
    "--migrate/--no-migrate",
    envvar=_env("migrate"),
    default=True,
    show_default=True,
    help="PostgreSQL: apply the schema at start-up (under an advisory lock), or only check"
    " it (applied out of band with payonce migrate).",
)
@click.option(
    "--encryption-key-file",
    envvar=_env("encryption_key_file"),
    default=None,
    type=click.Path(dir_okay=False),
    help="Encrypt stored bodies, headers and stream events (AES-256-GCM) with the keys in"
    " this file, one per line: the first encrypts, all decrypt. Or set"
    " PAYONCE_ENCRYPTION_KEY to the keys (comma-separated). `payonce encryption-key`"
    " makes one.",
)
@click.option(
    "--encryption-key",
    envvar=_env("encryption_key"),
    default=None,
    hidden=True,  # PAYONCE_ENCRYPTION_KEY only: refused on the command line
    callback=_env_only,
)
@click.option(
    "--host",
    envvar=_env("host"),
    default="127.0.0.1",
    show_default=True,
    help="Address the gateway listens on (0.0.0.0: every IPv4 interface).",
)
@click.option(
    "--port",
    envvar=_env("port"),
    type=int,
    default=8080,
    show_default=True,
    help="TCP port the gateway listens on.",
)
@click.option(
    "--tls-cert",
    envvar=_env("tls_cert"),
    default=None,
    type=click.Path(dir_okay=False),
    help="Serve HTTPS with this PEM certificate chain (and --tls-key).",
)
@click.option(
    "--tls-key",
    envvar=_env("tls_key"),
    default=None,
    type=click.Path(dir_okay=False),
    help="The certificate's private key (PEM, unencrypted).",
)
@click.option(
    "--require-key/--no-require-key",
    envvar=_env("require_key"),
    default=False,
    show_default=True,
    help="Refuse requests without an Idempotency-Key (400).",
)
@click.option(
    "--key-from-request-id/--no-key-from-request-id",
    envvar=_env("key_from_request_id"),
    default=False,
    show_default=True,
    help="Also accept X-Request-ID as the key (only if clients keep it across retries).",
)
@click.option(
    "--tenant-header",
    envvar=_env("tenant_header"),
    default=None,
    help="Header naming the tenant, instead of a hash of the credential.",
)
@click.option(
    "--credential-header",
    envvar=_env("credential_header"),
    multiple=True,
    metavar="NAME",
    help="Another header carrying a caller's credential (repeatable; in"
    " PAYONCE_CREDENTIAL_HEADER, names separated by commas or spaces). Authorization,"
    " x-api-key, api-key and x-goog-api-key are always read.",
)
@click.option(
    "--scenario-header",
    envvar=_env("scenario_header"),
    multiple=True,
    metavar="NAME",
    help="Another header naming a request's business scenario, such as"
    " Helicone-Property-Feature or x-litellm-tags (repeatable; X-Payonce-Scenario is"
    " always read, first).",
)
@click.option(
    "--scenarios",
    envvar=_env("scenarios"),
    multiple=True,
    metavar="A,B,C",
    help="The scenarios the metrics label (comma-separated, repeatable); any other is"
    " labelled 'other'. The call log keeps every scenario as sent.",
)
@click.option(
    "--credential-scenario",
    envvar=_env("credential_scenario"),
    multiple=True,
    metavar="TENANT=NAME",
    help="The scenario of a credential's requests that name none (TENANT from payonce"
    " tenant-id; repeatable, or a [credential-scenario] table in the config file).",
)
@click.option(
    "--require-credential/--no-require-credential",
    envvar=_env("require_credential"),
    default=False,
    show_default=True,
    help="Refuse keyed requests that carry no credential (401) instead of letting them"
    " share one anonymous tenant.",
)
@click.option(
    "--wait-timeout",
    envvar=_env("wait_timeout"),
    type=Duration(),
    default="60s",
    show_default=True,
    help="How long a duplicate waits for the running call before 409.",
)
@click.option(
    "--lease",
    envvar=_env("lease"),
    type=Duration(),
    default="30s",
    show_default=True,
    help="Claim lease, renewed every third of it while the upstream call runs.",
)
@click.option(
    "--shutdown-delay",
    envvar=_env("shutdown_delay"),
    type=Duration(),
    default="0s",
    show_default=True,
    help="At SIGTERM, answer /_payonce/health/ready 503 and keep serving this long"
    " before stopping (for load balancers and Kubernetes to take the gateway out first).",
)
@click.option(
    "--ttl",
    envvar=_env("ttl"),
    type=Duration(),
    default="24h",
    show_default=True,
    help="How long a completed record is kept and replayed, from when its answer was"
    " stored. A running call's record never expires while its lease is renewed, so"
    " this may be shorter than --upstream-timeout.",
)
@click.option(
    "--max-body",
    envvar=_env("max_body"),
    type=Size(),
    default="10MiB",
    show_default=True,
    help="Largest request body accepted (413 beyond).",
)
@click.option(
    "--max-header-bytes",
    envvar=_env("max_header_bytes"),
    type=Size(),
    default="64KiB",
    show_default=True,
    help="Largest request head (request line and header fields) accepted (431 beyond).",
)
@click.option(
    "--max-headers",
    envvar=_env("max_headers"),
    type=int,
    default=100,
    show_default=True,
    help="Most header fields accepted in one request (431 beyond).",
)
@click.option(
    "--header-timeout",
    envvar=_env("header_timeout"),
    type=Duration(),
    default="30s",
    show_default=True,
    help="Time a client has to send a whole request head (408 and closed beyond).",
)
@click.option(
    "--body-timeout",
    envvar=_env("body_timeout"),
    type=Duration(),
    default="30s",
    show_default=True,
    help="A request body must bring at least 1 KiB/s over each such window, so no pause"
    " lasts this long (408 and closed otherwise).",
)
@click.option(
    "--keep-alive-timeout",
    envvar=_env("keep_alive_timeout"),
    type=Duration(),
    default="5s",
    show_default=True,
    help="How long an idle kept-alive client connection stays open.",
)
@click.option(
    "--replay-cache",
    envvar=_env("replay_cache"),
    type=Size(allow_zero=True),
    default="64MiB",
    show_default=True,
    help="Memory for completed responses answered without a store read (0: off).",
)
@click.option(
    "--max-inflight-per-tenant",
    envvar=_env("max_inflight_per_tenant"),
    type=int,
    default=None,
    help="Keyed requests and runs one credential may have in flight (429 beyond; with"
    " --workers N, each worker admits its share, N rounded up).",
)
@click.option(
    "--max-new-keys-per-tenant",
    envvar=_env("max_new_keys_per_tenant"),
    default=None,
    metavar="RATE",
    help="New idempotency keys one credential may start, e.g. 600/m (429 beyond; a"
    " tenant then holds at most RATE x --ttl records).",
)
@click.option(
    "--max-stored-body",
    envvar=_env("max_stored_body"),
    type=Size(),
    default=None,
    help="Largest response (or stream's events) stored; a larger one is relayed but not"
    " stored, and its key released: a retry runs again.",
)
@click.option(
    "--on-disconnect",
    envvar=_env("on_disconnect"),
    type=click.Choice(["cancel", "continue"]),
    default="cancel",
    show_default=True,
    help="What to do with an unkeyed upstream call when its client leaves."
    " Keyed calls always continue, for the retry.",
)
@click.option(
    "--on-stream-disconnect",
    envvar=_env("on_stream_disconnect"),
    type=click.Choice(["finish", "cancel"]),
    default="finish",
    show_default=True,
    help="A keyed stream whose every client left: finish it (pay for the rest; the retry"
    " gets it free) or cancel it upstream (stop paying; a retry runs it again).",
)
@click.option(
    "--inject-stream-usage/--no-inject-stream-usage",
    envvar=_env("inject_stream_usage"),
    default=True,
    show_default=True,
    help="Add stream_options.include_usage to OpenAI streams that lack it (and strip that"
    " chunk before relaying), so every stream's cost is known.",
)
@click.option(
    "--match-sdk-retries/--no-match-sdk-retries",
    envvar=_env("match_sdk_retries"),
    default=True,
    show_default=True,
    help="Answer a retry the openai/anthropic SDKs declare (x-stainless-retry-count >= 1)"
    " without a key from the run of its first attempt with the same body.",
)
@click.option(
    "--sdk-retry-window",
    envvar=_env("sdk_retry_window"),
    type=Duration(),
    default="10m",
    show_default=True,
    help="At most this long an SDK call's answer waits for its retries (the SDK's"
    " declared read timeout, at least 60s).",
)
@click.option(
    "--dedupe-identical",
    envvar=_env("dedupe_identical"),
    type=Duration(),
    default=None,
    metavar="WINDOW",
    help="Treat a request without a key identical (tenant, method, path, body) to one"
    " running or answered within WINDOW as its duplicate: it joins or replays it. Off by"
    " default: two identical business requests would get one answer.",
)
@click.option(
    "--connect-timeout",
    envvar=_env("connect_timeout"),
    type=Duration(),
    default="5s",
    show_default=True,
    help="How long opening a connection to the upstream may take.",
)
@click.option(
    "--upstream-timeout",
    envvar=_env("upstream_timeout"),
    type=Duration(),
    default="600s",
    show_default=True,
    help="Read timeout of one upstream call.",
)
@click.option(
    "--connect-retries",
    envvar=_env("connect_retries"),
    type=int,
    default=2,
    show_default=True,
    help="Retries when the upstream provably got nothing.",
)
@click.option(
    "--call-log",
    envvar=_env("call_log"),
    default=None,
    help="Write one JSON line per request (docs/call-log.md) to this file, or '-' for stdout.",
)
@click.option(
    "--call-log-max-bytes",
    envvar=_env("call_log_max_bytes"),
    type=Size(),
    default="100MiB",
    show_default=True,
    help="Rotate the call log past this size.",
)
@click.option(
    "--call-log-backups",
    envvar=_env("call_log_backups"),
    type=int,
    default=5,
    show_default=True,
    help="Rotated call log files to keep (PATH.1 ... PATH.N).",
)
@click.option(
    "--prices",
    envvar=_env("prices"),
    default=None,
    type=click.Path(dir_okay=False),
    help="TOML or JSON file of model prices that win over the genai-prices database.",
)
@click.option(
    "--metrics/--no-metrics",
    envvar=_env("metrics"),
    default=True,
    show_default=True,
    help="Count requests, upstream calls, tokens and cost for /_payonce/metrics.",
)
@click.option(
    "--metrics-token",
    envvar=_env("metrics_token"),
    default=None,
    help="Require 'Authorization: Bearer TOKEN' on /_payonce/metrics (open by default:"
    " aggregates only).",
)
@click.option(
    "--otel/--no-otel",
    envvar=_env("otel"),
    default=True,
    show_default=True,
    help="Emit OpenTelemetry spans (request, upstream call) when opentelemetry-api is"
    " installed; configure the exporter with the OpenTelemetry SDK as usual.",
)
@click.option(
    "--sim-port",
    envvar=_env("sim_port"),
    type=int,
    default=8100,
    show_default=True,
    help="Port of the simulator started by --upstream sim.",
)
@click.option(
    "--log-level",
    envvar=_env("log_level"),
    default="info",
    show_default=True,
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    help="The least severe messages the gateway logs.",
)
@click.option(
    "--workers",
    envvar=_env("workers"),
    type=int,
    default=1,
    show_default=True,
    help="Worker processes sharing the port and the store (SQLite or Redis; not memory://)."
    " A supervisor restarts one that dies.",
)
@click.option(
    "--on-store-failure",
    envvar=_env("on_store_failure"),
    type=click.Choice(["closed", "open"]),
    default="closed",
    show_default=True,
    help="A keyed request while the store is down: 503 (closed), or forwarded unprotected,"
    " counted in payonce_unprotected_forwards_total (open).",
)
def serve_command(**options: Any) -> None:
    """Run the idempotency gateway in front of an LLM API.

    Every flag can also be set as a PAYONCE_<FLAG> environment variable
    (PAYONCE_WAIT_TIMEOUT=30s, PAYONCE_REQUIRE_KEY=true) or in the --config
    TOML file; flags win over variables, which win over the file.
    """
    from payonce.gateway.server import run  # imported here: uvicorn is not needed for --help

    settings = GatewaySettings(**options)
    if settings.workers > 1:
        from payonce.gateway.workers import run_workers

        run_workers(settings)
    else:
        run(settings)


@cli.command("migrate")
@click.option(
    "--store",
    envvar=_env("store"),
    required=True,
    help="The PostgreSQL store: postgresql://user@host:port/db.",
)
def migrate_command(store: str) -> None:
    """Apply payonce's schema to a PostgreSQL store, then exit (for serve --no-migrate).

    \b
    PAYONCE_STORE_PASSWORD=... payonce migrate --store postgresql://payonce@db/payonce

    Safe to run while gateways serve, and from several places at once: the
    migrations run under an advisory lock, each in one transaction. SQLite and
    Redis stores need none (SQLite migrates its file when it opens it).
    """
    import asyncio

    from payonce.store.postgres import SCHEMES, PostgresStore

    if store.partition("://")[0] not in SCHEMES:
        raise ConfigError("migrate: --store must be a postgresql:// URL (the others need none)")

    async def apply() -> list[int]:
        target = PostgresStore(store, migrate=True)
        try:
            return await target.prepare()
        finally:
            await target.close()

    from payonce.store.postgres.schema import SCHEMA_VERSION

    applied = asyncio.run(apply())
    if applied:
        click.echo(f"schema {SCHEMA_VERSION}: applied {', '.join(map(str, applied))}")
    else:
        click.echo(f"schema {SCHEMA_VERSION}: up to date")


@cli.command("tenant-id")
def tenant_id_command() -> None:
    """Print the tenant id the gateway logs for a credential read from standard input.

    \b
    printf %s "$OPENAI_API_KEY" | payonce tenant-id
    payonce tenant-id < keys.txt      # one credential per line, one id per line

    The credential is never echoed or written anywhere (typed at a terminal, it
    is read without echo). Use the ids in reconcile's --key-map. A request that
    carries several credentials at once is a tenant of its own.
    """
    from payonce.gateway.keys import ANONYMOUS, tenant_of_credential

    if sys.stdin.isatty():
        lines = [click.prompt("credential", hide_input=True, err=True)]
    else:
        lines = sys.stdin.read().splitlines()
    credentials = [line.strip() for line in lines if line.strip()]
    if not credentials:
        raise ConfigError("tenant-id: no credential on standard input")
    for credential in credentials:
        tenant = tenant_of_credential(credential)
        if tenant == ANONYMOUS:
            raise ConfigError("tenant-id: 'Bearer' without a key is no credential")
        click.echo(tenant)


@cli.command("encryption-key")
@click.option("--id", "show_ids", is_flag=True, help="Print the ids of keys read from stdin.")
def encryption_key_command(show_ids: bool) -> None:
    """Print a new key for --encryption-key-file or PAYONCE_ENCRYPTION_KEY (its id on stderr).

    \b
    (umask 077; payonce encryption-key > /etc/payonce/keys)   # readable by you alone
    payonce encryption-key >> /etc/payonce/keys   # rotation, step 1: a second key
    payonce encryption-key --id < /etc/payonce/keys   # the id of each key, as logged

    A key is 32 random bytes in base64url (43 characters).
    """
    from payonce.store.sealing import key_id, new_key, parse_keys

    if show_ids:
        for key in parse_keys(sys.stdin.read(), "encryption-key --id"):
            click.echo(key_id(key).hex())
        return
    fresh = new_key()
    click.echo(fresh)
    click.echo(f"key id: {key_id(parse_keys(fresh, 'key')[0]).hex()}", err=True)


@cli.command("run", context_settings={"ignore_unknown_options": True})
@click.option(
    "--gateway",
    default="http://127.0.0.1:8080",
    show_default=True,
    envvar="PAYONCE_GATEWAY",
    help="The gateway's base URL ($PAYONCE_GATEWAY).",
)
@click.option(
    "--key-header",
    default="Idempotency-Key",
    show_default=True,
    help="The header the SDKs send their per-call key in.",
)
@click.option(
    "--base-url/--no-base-url",
    default=True,
    show_default=True,
    help="Set OPENAI_BASE_URL and ANTHROPIC_BASE_URL to the gateway.",
)
@click.option(
    "--scenario",
    default=None,
    metavar="NAME",
    help="The business scenario every SDK call names (X-Payonce-Scenario) unless"
    " payonce.auto.scenario() names another ($PAYONCE_SCENARIO).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run_command(
    gateway: str, key_header: str, base_url: bool, scenario: str | None, command: tuple[str, ...]
) -> None:
    """Run COMMAND with every openai/anthropic SDK client protected by the gateway.

    \b
    payonce run -- python app.py
    payonce run --gateway http://payonce.internal:8080 -- gunicorn app:server

    The SDKs are pointed at the gateway (OPENAI_BASE_URL, ANTHROPIC_BASE_URL)
    and every client the application builds, copies made by with_options() or
    copy() included, sends the key its SDK mints per call on every retry of
    that call (openai 1.x-3.x, anthropic 1.x-2.x). The application is not
    changed; for a process started another way: import payonce.auto.
    """
    from payonce.auto.launch import environment, gateway_url, launch

    env = environment(
        os.environ,
        gateway_url(gateway),
        key_header=key_header,
        base_urls=base_url,
        scenario=scenario,
    )
    launch(command, env)


class _Commands(MutableMapping[str, click.Command]):
    """A group's commands, each of the named ones imported when first looked up.

    ``payonce serve`` (every gateway start, every worker) then imports none of the
    modules of lint, demo, torture and the other commands: about 60 ms a start.
    Everything else sees a mapping of all the commands, as click's own dict.
    """

    def __init__(self, loaded: MutableMapping[str, click.Command], named: dict[str, str]) -> None:
        self._loaded = dict(loaded)
        self._named = dict(named)  # command name -> "module:attribute"

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            module, _, attribute = self._named[name].partition(":")
            command = getattr(importlib.import_module(module), attribute)
            assert isinstance(command, click.Command), self._named[name]
            self._loaded[name] = command
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._named.pop(name, None)
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._named.pop(name, None)
        self._loaded.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in self._named

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self._loaded), **dict.fromkeys(self._named)})

    def __len__(self) -> int:
        return len(self._loaded.keys() | self._named.keys())


cli.commands = _Commands(
    cli.commands,
    {
        "sim": "payonce.sim.cli:sim_command",
        "reconcile": "payonce.reconcile.cli:reconcile_command",
        "lint": "payonce.lint.cli:lint_command",
        "demo": "payonce.demo.cli:demo_command",
        "simulate": "payonce.simulate.cli:simulate_command",
        "torture": "payonce.torture.cli:torture_command",
    },
)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors, exit code 2 for bad input."""
    try:
        cli.main(args=argv, prog_name="payonce", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        sys.exit(0)
    except click.UsageError as exc:
        click.echo(f"payonce: error: {exc.format_message()}", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"payonce: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except ConfigError as exc:
        click.echo(f"payonce: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except PayonceError as exc:
        click.echo(f"payonce: error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
