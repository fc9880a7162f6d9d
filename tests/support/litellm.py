"""The LiteLLM proxy as an upstream: its own virtualenv, a config, a running proxy.

Many teams already run the LiteLLM proxy for routing and virtual keys; payonce
goes in front of it. ``tests/upstreams/test_litellm.py`` starts it with a config
that routes to ``payonce sim`` and puts the gateway in front.

LiteLLM is never a dependency of payonce: it lives in its own virtualenv,
``.venv/litellm/<version>-<hash of the pins>/``, made by the first test run
(about 3 minutes, 750 MB, from PyPI) and reused while
``litellm_requirements.txt`` beside this file (the lock, with every package's
hashes, made from ``litellm_requirements.in``) and ``pip_requirements.txt`` stay
the same. A virtualenv is
complete once its ``.complete`` file exists; a build that was interrupted is
started again from scratch, and older builds are removed. The build holds a
lock, so two test runs never build at once.

Why 1.108.7: the newest release whose ``[proxy]`` extra installs from PyPI
here (1.108.8 to 1.110.2 pin ``litellm-enterprise``, ``litellm-proxy-extras`` or
``litellm-proxy`` releases that PyPI does not serve). The releases known to have
been compromised on PyPI (1.82.7, 1.82.8) are long past; the install is checked
for startup hooks (``.pth`` files that run code), which is how 1.82.8's payload ran.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.support.locking import locked
from tests.support.processes import Process, _wait_ready, free_port

__all__ = [
    "LITELLM_VERSION",
    "LOG",
    "MASTER_KEY",
    "Installation",
    "config_text",
    "prepare",
    "start_proxy",
]

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".venv" / "litellm"
REQUIREMENTS = Path(__file__).with_name("litellm_requirements.txt")
PIP = Path(__file__).with_name("pip_requirements.txt")  # installed first (why: in it)
LITELLM_VERSION = "1.108.7"

# The proxy refuses to start without a master key (or with a weak one). Callers
# present it as their credential; to payonce it is the tenant, like any API key.
MASTER_KEY = "sk-payonce-litellm-test-5f0c9e2a41d87b36c0e4a9d2f18b7e6c"
# What LiteLLM presents to the simulator: the ledger's api_key_id is LiteLLM's.
UPSTREAM_KEY = "sk-litellm-to-sim"

# .pth files that only set paths or come with setuptools; any other that imports
# something runs code at every interpreter start.
_HARMLESS_PTH = frozenset({"distutils-precedence.pth"})


@dataclass(frozen=True)
class Installation:
    """LiteLLM's virtualenv, ready to run."""

    python: Path
    created: bool  # this call built it
    seconds: float  # how long building it took (0 when reused)


LOG = HOME / "install.log"


def prepare(say: Callable[[str], object] = print) -> Installation:
    """The pinned LiteLLM proxy's virtualenv, built when missing (raises when it cannot be).

    ``say`` is told before a build starts: what, how long, where its log is.
    """
    digest = hashlib.sha256(PIP.read_bytes() + REQUIREMENTS.read_bytes()).hexdigest()[:12]
    target = HOME / f"{LITELLM_VERSION}-{digest}"
    python = target / "bin" / "python"
    HOME.mkdir(parents=True, exist_ok=True)
    with locked(HOME / ".lock"):
        if (target / ".complete").exists():
            return Installation(python, created=False, seconds=0.0)
        for stale in HOME.iterdir():  # older pins, or this one half built
            if stale.is_dir():
                shutil.rmtree(stale)
        started = time.monotonic()
        log = LOG
        say(
            f"prepare: installing the LiteLLM proxy {LITELLM_VERSION} into {target}, once"
            f" (about 3 minutes, 750 MB from PyPI); log: {log}"
        )
        pip_install = [str(python), "-m", "pip", "install", "--no-input", "--require-hashes"]
        with log.open("wb") as out:
            for command in (
                [sys.executable, "-m", "venv", str(target)],
                # pip first, then every package pinned with its hashes: nothing
                # but what was locked.
                [*pip_install, "-r", str(PIP)],
                [*pip_install, "-r", str(REQUIREMENTS)],
            ):
                done = subprocess.run(
                    command, stdout=out, stderr=subprocess.STDOUT, timeout=1800, check=False
                )
                if done.returncode != 0:
                    tail = log.read_text(errors="replace")[-4000:]
                    raise RuntimeError(f"{command[2:4]} failed ({done.returncode}):\n{tail}")
        _check(python, target)
        (target / ".complete").touch()
        return Installation(python, created=True, seconds=time.monotonic() - started)


def _check(python: Path, target: Path) -> None:
    version = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    if version != LITELLM_VERSION:
        raise RuntimeError(f"installed litellm {version}, pinned {LITELLM_VERSION}")
    hooks = [
        pth
        for pth in target.glob("lib/python*/site-packages/*.pth")
        if pth.name not in _HARMLESS_PTH and "import" in pth.read_text(errors="replace")
    ]
    if hooks:
        raise RuntimeError(f"startup hooks in LiteLLM's virtualenv, not run: {hooks}")


def config_text(sim_url: str, deployments: Mapping[str, Mapping[str, object]]) -> str:
    """A LiteLLM proxy config: one ``openai/`` deployment per entry, all to the simulator.

    No ``litellm_settings`` or ``router_settings``: a deployment without its own
    ``num_retries`` gets the Router's default. ``forward_client_headers_to_llm_api``
    passes the callers' ``x-`` headers on, so ``X-Sim-*`` reach the simulator.
    """
    lines = ["model_list:"]
    for name, params in deployments.items():
        lines += [f"  - model_name: {name}", "    litellm_params:"]
        merged = {"api_base": f"{sim_url}/v1", "api_key": UPSTREAM_KEY, **params}
        lines += [f"      {key}: {value}" for key, value in merged.items()]
    lines += [
        "general_settings:",
        f"  master_key: {MASTER_KEY}",
        "  forward_client_headers_to_llm_api: true",
    ]
    return "\n".join(lines) + "\n"


def start_proxy(installation: Installation, config: Path, log_dir: Path) -> Process:
    """``python -m litellm.proxy.proxy_cli --config ...`` on a free port, once it answers.

    Config only, no database. ``LITELLM_LOCAL_MODEL_COST_MAP`` keeps it from
    fetching its price list from the network at startup. Starting takes 25 to
    40 s on two busy cores (importing the proxy is most of it).
    """
    port = free_port()
    log = log_dir / f"litellm-{port}.log"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("LITELLM_", "DATABASE_", "OPENAI_"))
    }
    env |= {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as handle:
        popen = subprocess.Popen(
            [
                *(str(installation.python), "-m", "litellm.proxy.proxy_cli"),
                *("--config", str(config), "--host", "127.0.0.1", "--port", str(port)),
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=log_dir,
            start_new_session=True,
        )
    proxy = Process(popen=popen, url=f"http://127.0.0.1:{port}", log=log)
    _wait_ready(proxy, "/health/liveliness", timeout=180)
    return proxy
