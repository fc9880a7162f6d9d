"""The docs site: ``mkdocs build --strict`` passes, and the generated pages are whole.

The build (mkdocs.yml) fails on any warning: a link to a page or an anchor that
does not exist, a page left out of the nav, a docstring mkdocstrings cannot read.
The reference pages come from the code at build time (docs/hooks/reference.py);
these tests check them against the code they were generated from.

The code blocks this file runs are marked ``<!-- run by tests/test_docs_site.py:
NAME -->`` in docs/index.md and docs/benchmarks.md: the first replayed call, against
a real ``payonce serve --upstream sim``. The commands of docs/benchmarks.md are
checked without running the benchmarks: each script exists and its ``--help``
lists every flag the page gives it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from payonce.cli import cli
from payonce.config import GatewaySettings
from payonce.gateway.openapi import openapi_document
from tests.support.processes import free_port, running

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOTEBOOK = ROOT / "benchmarks" / "NOTEBOOK.md"
MARKER = re.compile(r"^<!-- run by tests/test_docs_site\.py: ([\w-]+) -->$", re.M)
# The blocks this file runs, by the name their marker gives.
RUN_HERE = {"first-replayed-call"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    # Material prints a notice about MkDocs 2.0 on every build unless told not to.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}"
    return out


def _commands(command: click.Command, path: str) -> list[tuple[str, click.Command]]:
    found = [(path, command)]
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            if not sub.hidden:
                found += _commands(sub, f"{path} {name}")
    return found


def test_the_cli_reference_lists_every_command_and_option(site: Path) -> None:
    page = (site / "reference" / "cli" / "index.html").read_text()
    commands = _commands(cli, "payonce")
    assert len(commands) > 10
    for path, command in commands:
        anchor = path.replace(" ", "-")
        assert f'id="{anchor}"' in page, f"{path}: no section in the CLI reference"
        section = page.split(f'id="{anchor}"', 1)[1].split("<h2", 1)[0]
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.opts[0] in section, f"{path}: {param.opts[0]} missing"


def test_the_configuration_reference_has_every_setting(site: Path) -> None:
    page = (site / "reference" / "configuration" / "index.html").read_text()
    for field in dataclasses.fields(GatewaySettings):
        env = "PAYONCE_" + field.name.upper()
        assert env in page, f"{field.name}: no row in the configuration reference"
        if field.name != "encryption_key":  # the variable only, never a flag or a key
            assert f"<code>{field.name.replace('_', '-')}</code>" in page


def test_the_python_api_page_rendered(site: Path) -> None:
    page = (site / "reference" / "api" / "index.html").read_text()
    for name in (
        "payonce.client.RetryPolicy",
        "payonce.client.protect",
        "payonce.client.IdempotentTransport",
        "payonce.testing.ManualClock",
        "payonce.auto.scenario",
        "payonce.errors.PayonceError",
    ):
        assert f'id="{name}"' in page, f"{name} not rendered by mkdocstrings"
    # A docstring's text, not only the headings.
    assert "one key per call" in page


def test_the_openapi_reference_is_the_served_document(site: Path) -> None:
    document = openapi_document()
    assert json.loads((site / "reference" / "openapi.json").read_text()) == document
    page = (site / "reference" / "openapi" / "index.html").read_text()
    for path in document["paths"]:
        assert path in page, f"{path} missing from the OpenAPI page"


def test_every_page_is_in_the_nav(site: Path) -> None:
    # mkdocs --strict flags pages left out of the nav; this says which pages the
    # site must have, so a page deleted by mistake is noticed too.
    pages = sorted(p.stem for p in DOCS.glob("*.md"))
    for stem in pages:
        target = site / ("index.html" if stem == "index" else f"{stem}/index.html")
        assert target.exists(), f"docs/{stem}.md was not built"


def test_the_code_blocks_of_the_pages_written_for_the_site_are_marked() -> None:
    for page in ("index.md", "benchmarks.md"):
        lines = (DOCS / page).read_text().splitlines()
        fences = [i for i, line in enumerate(lines) if line.startswith("```")]
        for opening in fences[::2]:
            assert MARKER.match(lines[opening - 1]), f"{page}:{opening + 1}: unmarked block"
    names = {name for page in DOCS.glob("*.md") for name in MARKER.findall(page.read_text())}
    assert names == RUN_HERE, "a marked block with no test here, or a test with no block"


def _block(page: str, name: str) -> str:
    text = (DOCS / page).read_text()
    after = text.split(f"<!-- run by tests/test_docs_site.py: {name} -->\n", 1)[1]
    match = re.match(r"```\w*\n(.*?)\n```", after, re.S)
    assert match is not None, f"{page}: no code block after the marker {name}"
    return match.group(1)


def test_the_first_replayed_call(tmp_path: Path) -> None:
    """docs/index.md's curl calls, as written, with the ports `make run` uses swapped."""
    sim_port = free_port()
    args = ["serve", "--upstream", "sim", "--store", "memory://", "--sim-port", str(sim_port)]
    with running(args, log_dir=tmp_path, ready_path="/_payonce/health") as gateway:
        script = (
            _block("index.md", "first-replayed-call")
            .replace("http://127.0.0.1:8080", gateway.url)
            .replace("http://127.0.0.1:8100", f"http://127.0.0.1:{sim_port}")
        )
        assert gateway.url in script and str(sim_port) in script
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert result.returncode == 0, result.stderr
    out = result.stdout.lower()
    assert out.count("http/1.1 200 ok") == 2, result.stdout
    first, _ = out.split("idempotent-replayed: true", 1)
    assert "idempotent-replayed: false" in first
    assert "x-payonce-cost-usd" in first
    ledger = json.loads(result.stdout.strip().splitlines()[-1])
    assert ledger["billed"] == 1


def _benchmark_commands() -> list[str]:
    text = (DOCS / "benchmarks.md").read_text()
    return [
        command
        for command in re.findall(r"`([^`\n]+)`", text)
        if re.search(r"\bbenchmarks[/.]\w+", command) and "python" in command
    ]


@pytest.mark.parametrize("command", _benchmark_commands())
def test_each_benchmark_command_names_a_script_and_its_flags(command: str) -> None:
    words = shlex.split(command)
    python = next(i for i, word in enumerate(words) if word.endswith("python"))
    assert words[python] == ".venv/bin/python", "commands run from a checkout after make run"
    if words[python + 1] == "-m":
        script = ROOT / (words[python + 2].replace(".", "/") + ".py")
        rest = words[python + 3 :]
    else:
        script = ROOT / words[python + 1]
        rest = words[python + 2 :]
    assert script.is_file(), f"{script.relative_to(ROOT)} does not exist"
    # A quoted value of several words ("--max-stored-body 1MiB" for --new-flags) is a value.
    flags = [word.split("=", 1)[0] for word in rest if word.startswith("--") and " " not in word]
    source = script.read_text()
    if "argparse" not in source:
        # No options to check (sse_splitter.py runs the benchmark whatever it is given).
        assert not flags, f"{script.name} takes no options"
        return
    help_text = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    for flag in flags:
        # Some scripts hand their own options to another's parser after their own:
        # the flag is then in the source, quoted as argparse is given it.
        listed = re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text)
        assert listed or f'"{flag}"' in source, f"{script.name} has no option {flag}"


def _notebook_anchors() -> set[str]:
    anchors = set()
    for line in NOTEBOOK.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_the_links_and_citations_of_the_notebook_land() -> None:
    """Links to benchmarks/NOTEBOOK.md#anchor, and "NOTEBOOK.md, "Section"" citations."""
    anchors = _notebook_anchors()
    titles = [
        line.lstrip("#").strip()
        for line in NOTEBOOK.read_text().splitlines()
        if line.startswith("#")
    ]
    files = [
        ROOT / "README.md",
        *DOCS.glob("*.md"),
        *(ROOT / "src").rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "benchmarks").glob("*.py"),
    ]
    cited = 0
    for path in files:
        if path == Path(__file__).resolve():
            continue
        text = path.read_text()
        assert "docs/benchmarks.md," not in text, f"{path}: cites the old notebook's place"
        for anchor in re.findall(r"NOTEBOOK\.md#([\w-]+)", text):
            cited += 1
            assert anchor in anchors, f"{path}: no heading #{anchor} in the notebook"
        for title in re.findall(r'NOTEBOOK\.md, "([^"\n]+)', text):
            cited += 1
            assert any(t.startswith(title.rstrip()) for t in titles), (
                f'{path}: no section "{title}" in the notebook'
            )
    assert cited > 5
