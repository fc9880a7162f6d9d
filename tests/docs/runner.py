"""How a docs code block runs: the rules of docs/development.md ("Docs code blocks").

``sh``: the block becomes one bash script (``set -euo pipefail``) run in a
temporary folder that holds the checkout's top-level entries as symlinks and
``.venv`` (``.venv/bin`` first on PATH), with these rewrites:

- the ports 8080 (gateway), 8100 (simulator) and 9090 (Prometheus) become free
  ports, wherever they are written;
- /etc/payonce, /var/lib/payonce, /var/log/payonce and /srv/ become folders
  under the temporary folder;
- a long-running server (``payonce serve``, ``payonce sim``, ``prometheus``) is
  started in the background, waited for on its port, and stopped when the
  block ends; ``payonce serve`` without ``--port`` gets the gateway's port,
  without ``--sim-port`` the simulator's (for ``--upstream sim``, the default);
- ``pip install 'payonce[EXTRA]'`` is checked, not run: EXTRA is an extra of
  pyproject.toml and each of its requirements is installed in .venv;
- ``make TARGET`` runs as ``make -n TARGET`` in the checkout (the suite does
  not run itself);
- ``pytest ...`` runs with ``--collect-only -q`` in the checkout.

``console``: each ``$ `` line runs as above, in the foreground; the lines
after it are its expected output, compared loosely (:func:`loosely_in`).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import click
from packaging.requirements import Requirement

from payonce.cli import cli
from tests.docs.blocks import ROOT
from tests.support.processes import free_port

VENV = Path(sys.prefix)
DOC_PORTS = {"8080": "gateway", "8100": "sim", "9090": "prometheus"}
SYSTEM_PATHS = ("/etc/payonce", "/var/lib/payonce", "/var/log/payonce", "/srv/")
BACKGROUND = re.compile(
    r"^(?:\S*/)?(?:payonce (?:serve|sim)\b|prometheus\b|python -m payonce (?:serve|sim)\b)"
)
ASSIGNMENT = re.compile(r"""^[A-Z_][A-Z0-9_]*=(?:"[^"]*"|'[^']*'|\S*)\s+""")
PIP_EXTRA = re.compile(r"""^pip install '?payonce\[(\w+)\]'?$""")
CRON = re.compile(r"^(?:[\d*/,-]+\s+){5}")


@dataclass
class Workspace:
    """The temporary folder a block runs in, and the free ports it uses."""

    path: Path
    ports: dict[str, int] = field(default_factory=dict)

    @classmethod
    def make(cls, path: Path) -> Workspace:
        for entry in ROOT.iterdir():
            if entry.name not in {".git", ".venv", "dist"}:
                (path / entry.name).symlink_to(entry)
        (path / ".venv").symlink_to(VENV)
        for system in SYSTEM_PATHS:
            (path / "root" / system.strip("/")).mkdir(parents=True, exist_ok=True)
        return cls(path, {name: free_port() for name in DOC_PORTS.values()})

    def rewrite(self, text: str) -> str:
        """The block's text with this workspace's ports and folders."""
        for port, name in DOC_PORTS.items():
            text = re.sub(rf"(?<=[:= ]){port}\b", str(self.ports[name]), text)
        for system in SYSTEM_PATHS:
            text = text.replace(system, f"{self.path}/root{system}")
        return text

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PAYONCE_"))}
        paths = [str(ROOT / "src"), str(ROOT)]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        return env | {
            "PATH": f"{VENV / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}",
            "PYTHONPATH": ":".join(paths),
            "OPENAI_API_KEY": "sk-docs-tenant",
            "ANTHROPIC_API_KEY": "sk-ant-docs-tenant",
            "PYTHONUNBUFFERED": "1",
            "NO_COLOR": "1",
            "COLUMNS": "200",
            **extra,
        }


def commands(text: str) -> list[str]:
    """The block's commands: continuation lines joined, blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip()]


def program(command: str) -> str:
    """The command without its leading ``NAME=value`` assignments and comment."""
    while match := ASSIGNMENT.match(command):
        command = command[match.end() :]
    return command


def strip_comment(command: str) -> str:
    """``cmd   # comment`` -> ``cmd`` (a ``#`` after whitespace, outside quotes)."""
    for match in re.finditer(r"\s+#", command):
        head = command[: match.start()]
        if head.count("'") % 2 == 0 and head.count('"') % 2 == 0:
            return head
    return command


def check_extra(extra: str) -> None:
    """``pip install 'payonce[extra]'``: the extra exists and what it needs is installed."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert extra in extras, f"pyproject.toml has no extra {extra!r}"
    for requirement in map(Requirement, extras[extra]):
        installed = importlib.metadata.version(requirement.name)
        assert requirement.specifier.contains(installed, prereleases=True), (
            f"{requirement}: {installed} installed"
        )


def script(text: str, workspace: Workspace) -> str:
    """The bash script that runs an ``sh`` block by the rules above."""
    lines = [
        "set -euo pipefail",
        "pids=()",
        'stop() { for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done;'
        " wait || true; }",
        "trap stop EXIT",
        "declare -A port_pid=()",
        'stop_port() { local p="${port_pid[$1]:-}"; [ -z "$p" ] && return;'
        ' kill -TERM -- "-$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; }',
        # 60 s at most: a server starting on a busy machine, not a measure of speed.
        "wait_port() { for _ in $(seq 1200); do (: </dev/tcp/127.0.0.1/$1) 2>/dev/null && return;"
        ' sleep 0.05; done; echo "nothing listens on port $1" >&2; cat bg-*.log >&2; return 1; }',
    ]
    for number, command in enumerate(commands(workspace.rewrite(text))):
        if command.startswith("#"):
            continue
        bare = strip_comment(program(command))
        if extra := PIP_EXTRA.match(bare):
            check_extra(extra[1])
            lines.append(f": checked payonce[{extra[1]}]")
        elif bare.startswith("make "):
            lines.append(f"make -n -C {shlex.quote(str(ROOT))} {bare[5:]}")
        elif re.match(r"^(?:\S*/)?pytest ", bare):
            pytest = re.sub(r"^\S*pytest", f"{VENV}/bin/pytest", bare)
            lines.append(f"(cd {shlex.quote(str(ROOT))} && {pytest} --collect-only -q)")
        elif BACKGROUND.match(bare):
            lines += background(strip_comment(command), bare, number, workspace)
        else:
            lines.append(command)
    return "\n".join(lines) + "\n"


def background(command: str, bare: str, number: int, workspace: Workspace) -> list[str]:
    """Start a server in the background and wait until it listens."""
    ports = workspace.ports
    if re.search(r"payonce serve\b", bare):
        if "--port" not in bare:
            command += f" --port {ports['gateway']}"
        if "--sim-port" not in bare:  # --upstream sim, which is also the default
            command += f" --sim-port {ports['sim']}"
    port = re.search(r"(?:--port[ =]|--web\.listen-address=[\d.]*:)(\d+)", command)
    assert port is not None, f"no port to wait for in {command}"
    assignments = command[: len(command) - len(program(command))]
    # One server per port: the one started before on it (an alternative the block
    # shows) stops first.
    return [
        f"stop_port {port[1]}",
        f"{assignments}setsid {program(command)} > bg-{number}.log 2>&1 &",
        f"pids+=($!); port_pid[{port[1]}]=$!",
        f"wait_port {port[1]}",
        'kill -0 "$!" || { cat bg-*.log >&2; exit 1; }',
    ]


def run_sh(
    text: str, workspace: Workspace, timeout: float = 120, *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["bash", "-c", script(text, workspace)],
        cwd=workspace.path,
        env=workspace.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0 or not check, (
        f"exit {done.returncode}\n{script(text, workspace)}\n--- stdout\n{done.stdout[-4000:]}"
        f"\n--- stderr\n{done.stderr[-4000:]}"
    )
    return done


def loosely_in(expected: str, actual: str) -> bool:
    """Every word of ``expected`` is in ``actual``, in order, spacing and line breaks
    aside; a ``...`` in ``expected`` stands for anything."""
    words = actual.split()
    position = 0
    for word in expected.split():
        if word == "...":
            continue
        if word.endswith("...") or word.startswith("..."):
            word = word.strip(".")
            found = next((i for i in range(position, len(words)) if word in words[i]), None)
        else:
            found = next((i for i in range(position, len(words)) if words[i] == word), None)
        if found is None:
            return False
        position = found + 1
    return True


def run_console(text: str, workspace: Workspace) -> None:
    """Each ``$ `` command run in the foreground; its output compared loosely."""
    pairs: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        else:
            assert pairs, f"output before any command: {line}"
            pairs[-1][1].append(line)
    for command, expected in pairs:
        done = subprocess.run(
            ["bash", "-c", workspace.rewrite(command)],
            cwd=workspace.path,
            env=workspace.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        output = workspace.rewrite("\n".join(expected))
        actual = done.stdout + done.stderr
        assert loosely_in(output, actual), f"$ {command}\nexpected:\n{output}\ngot:\n{actual}"


def payonce_commands(text: str) -> list[list[str]]:
    """The payonce commands of a block (after assignments, a cron schedule, .venv/bin/)."""
    found = []
    for command in commands(text):
        if command.startswith("#"):
            continue
        bare = strip_comment(program(CRON.sub("", command).replace("\\%", "%")))
        words = shlex.split(re.sub(r"\$\([^)]*\)", "SUBSTITUTED", bare))
        if words and Path(words[0]).name == "payonce":
            found.append(words[1:])
    return found


def parse(args: list[str]) -> None:
    """Parse ``payonce ARGS`` as the CLI would, without running it."""
    name, rest = args[0], args[1:]
    command = cli.commands.get(name)
    assert command is not None, f"payonce has no command {name!r}"
    with click.Context(cli, info_name="payonce") as parent:
        try:
            command.make_context(name, rest, parent=parent)
        except click.BadParameter as exc:
            # A file or folder of the machine the page is about (/var/log/..., an old
            # checkout): its name parsed, its existence not required here.
            if "does not exist" not in exc.format_message():
                raise


def options() -> set[str]:
    """Every option of every payonce command."""
    names = set()
    for command in cli.commands.values():
        for param in command.params:
            names.update(getattr(param, "opts", ()))
            names.update(getattr(param, "secondary_opts", ()))
    return names
