"""``payonce run -- COMMAND``: run an application with its SDKs pointed at a gateway.

The way ``opentelemetry-instrument`` and ``ddtrace-run`` work: the command runs
in place of this process (``exec``) with an environment that

- points the official SDKs at the gateway: ``OPENAI_BASE_URL`` (the gateway's
  ``/v1``) and ``ANTHROPIC_BASE_URL`` (the gateway; the SDK adds ``/v1``), which
  both SDKs read when a client is built without ``base_url=``;
- puts a folder holding a ``sitecustomize`` first on ``PYTHONPATH``, so every
  Python interpreter the command starts (and the processes it starts in turn)
  installs the patch of :mod:`payonce.auto` before the application's code runs.

A client built with an explicit ``base_url=`` keeps it: the key is sent
wherever the client sends.
"""

from __future__ import annotations

import os
import shutil
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path

from payonce.auto._patch import HEADER_ENV, SCENARIO_ENV
from payonce.errors import CommandNotFound, ConfigError

__all__ = ["BOOT", "environment", "gateway_url", "launch"]

BOOT = Path(__file__).with_name("_boot")
# RFC 9110 token characters: what a header name may be.
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def gateway_url(value: str) -> str:
    """``value`` as the gateway's base URL: ``http[s]://host[:port][/prefix]``, no final slash."""
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"--gateway: {value!r} is not an http:// or https:// URL")
    if parsed.query or parsed.fragment:
        raise ConfigError(f"--gateway: {value!r} has a query or fragment; give the base URL")
    return value.rstrip("/")


def environment(
    base: Mapping[str, str],
    gateway: str,
    *,
    key_header: str,
    base_urls: bool,
    scenario: str | None = None,
) -> dict[str, str]:
    """The command's environment: ``base`` with the SDK variables and the boot folder."""
    if not key_header or not set(key_header) <= _TOKEN:
        raise ConfigError(f"--key-header: {key_header!r} is not a header name")
    env = dict(base)
    if base_urls:
        env["OPENAI_BASE_URL"] = gateway + "/v1"
        env["ANTHROPIC_BASE_URL"] = gateway
    env[HEADER_ENV] = key_header
    if scenario is not None:
        if not scenario.strip() or not scenario.isprintable():
            raise ConfigError(f"--scenario: {scenario!r} is not a header value")
        env[SCENARIO_ENV] = scenario.strip()
    paths = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    env["PYTHONPATH"] = os.pathsep.join([str(BOOT), *(p for p in paths if p != str(BOOT))])
    return env


def launch(command: Sequence[str], env: Mapping[str, str]) -> None:
    """Replace this process by ``command`` (never returns), or raise ConfigError (exit 127)."""
    if not command:
        raise ConfigError("run: no command given: payonce run -- python app.py")
    program = shutil.which(command[0], path=env.get("PATH"))
    if program is None:
        raise CommandNotFound(f"run: command not found: {command[0]}")
    # exec, not a child: signals, exit codes and the process tree stay the command's.
    os.execve(program, list(command), dict(env))  # noqa: S606
