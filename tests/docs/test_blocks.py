"""Every fenced code block of docs/*.md runs: by the generic runner, or by the test its
marker names (tests/docs/blocks.py). The rules: docs/development.md, "Docs code blocks"."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib

import click
import pytest
import yaml

from payonce.cli import cli
from payonce.config import load_toml
from payonce.observe.pricing import load_prices
from tests.docs.blocks import ROOT, Block, all_blocks
from tests.docs.runner import (
    Workspace,
    loosely_in,
    options,
    parse,
    payonce_commands,
    run_console,
    run_sh,
)
from tests.observe.test_dashboard import exported, problems_with
from tests.support.apt import installed
from tests.support.processes import Process

DOC_URL = "http://127.0.0.1:8080"
OUTPUT = "output of the block above"
PARSED = "parsed, not run:"
RULE = re.compile(r"^(PO\d{3})\b")
LINT_FILES = {"python": "example.py", "nginx": "nginx.conf", "yaml": "proxy.yaml"}


def _generic() -> list[Block]:
    return [found for found in all_blocks() if found.named is None and found.marker(OUTPUT) is None]


def _following(found: Block) -> Block | None:
    """The block right after ``found`` on its page, when it shows ``found``'s output."""
    blocks = [other for other in all_blocks() if other.page == found.page]
    after = [other for other in blocks if other.line > found.line]
    if after and after[0].marker(OUTPUT) is not None:
        return after[0]
    return None


def _lint_rule(found: Block) -> str | None:
    """A lint rule's before/after example: the rule of its section."""
    rule = RULE.match(found.heading)
    if (
        rule
        and re.search(r"^# before", found.text, re.M)
        and re.search(r"^# after", found.text, re.M)
    ):
        return rule[1]
    return None


# ------------------------------------------------------------------ every block accounted for


def unaccounted(blocks: list[Block]) -> list[str]:
    """What is wrong with these blocks' markers; [] when every block is run."""
    problems = []
    named: dict[str, Block] = {}
    for found in blocks:
        if found.named is None:
            continue
        _kind, path, name = found.named
        if name in named:
            problems.append(f"{found.id}: a second block named {name}")
        named[name] = found
        test = ROOT / path
        if not test.is_file():
            problems.append(f"{found.id}: {path} does not exist")
            continue
        source = test.read_text()
        reads = ("block(", "recipe(") if found.page == "recipes.md" else ("block(",)
        if f'"{name}"' not in source:
            problems.append(f"{found.id}: {path} never names {name}")
        elif not any(call in source for call in reads):
            problems.append(f"{found.id}: {path} reads no docs block")
    generic = [found for found in blocks if found.named is None and found.marker(OUTPUT) is None]
    for index, found in enumerate(blocks):
        if found.marker(OUTPUT) is not None:
            before = blocks[index - 1] if index else None
            if before is None or before.page != found.page or before not in generic:
                problems.append(f"{found.id}: the block above it is not run by the generic runner")
    for found in generic:
        if not (_lint_rule(found) or found.lang in RUNNERS):
            problems.append(f"{found.id}: a {found.lang or 'plain'} block without a runner")
    return problems


def test_every_block_is_run_by_the_generic_runner_or_by_the_test_its_marker_names() -> None:
    blocks = all_blocks()
    assert len(blocks) > 60, "the docs pages were not found"
    assert unaccounted(blocks) == []


def test_the_check_catches_an_unrun_block_and_a_test_that_never_reads_it() -> None:
    def fake(lang: str, *markers: str, line: int = 1) -> Block:
        return Block("fake.md", line, lang, "x\n", markers, "")

    this = "tests/docs/test_blocks.py"
    assert unaccounted([fake("python"), fake("toml", line=5)]) == []
    assert unaccounted([fake("ruby")]) == ["fake.md:1: a ruby block without a runner"]
    assert unaccounted([fake("sh", f"run by {this}: never-named")]) == [
        f"fake.md:1: {this} never names never-named"
    ]
    assert unaccounted([fake("sh", "run by tests/nowhere.py: x")]) == [
        "fake.md:1: tests/nowhere.py does not exist"
    ]
    assert unaccounted([fake("text", OUTPUT)]) == [
        "fake.md:1: the block above it is not run by the generic runner"
    ]


def test_the_loose_comparison_keeps_the_order_and_skips_the_dots() -> None:
    assert loosely_in("a b ... d", "a  b\n c d e")
    assert not loosely_in("b a", "a b")
    assert loosely_in("PO501 proxy_next_upstream ...", "x PO501 proxy_next_upstream y z")


# ------------------------------------------------------------------ the generic runner


def run_python(found: Block, workspace: Workspace, gateway: Process | None) -> str:
    code = found.text
    if DOC_URL in code:
        assert gateway is not None
        code = code.replace(DOC_URL, gateway.url)
    path = workspace.path / "block.py"
    path.write_text(code)
    done = subprocess.run(
        [sys.executable, str(path)],
        cwd=workspace.path,
        env=workspace.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"{found.id}:\n{code}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def run_lint_example(found: Block, rule: str, workspace: Workspace) -> None:
    """Before: ``payonce lint`` reports the section's rule; after: nothing."""
    before, after = re.split(r"^# after.*\n", found.text, maxsplit=1, flags=re.M)
    for part, want in ((before, True), (after, False)):
        folder = workspace.path / ("before" if want else "after")
        folder.mkdir()
        (folder / LINT_FILES[found.lang]).write_text(part)
        if found.lang == "python":
            compile(part, str(folder / "example.py"), "exec")
        done = subprocess.run(
            [sys.executable, "-m", "payonce", "lint", "-q", str(folder)],
            env=workspace.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        codes = re.findall(r"^\S+:\d+:\d+: (PO\d{3})", done.stdout, re.M)
        if want:
            assert rule in codes, f"{found.id} before: no {rule}\n{part}\n{done.stdout}"
        else:
            assert codes == [], f"{found.id} after: still {codes}\n{part}\n{done.stdout}"


def run_toml(found: Block, workspace: Workspace) -> None:
    path = workspace.path / "block.toml"
    path.write_text(found.text)
    document = tomllib.loads(found.text)
    if "models" in document:  # a --prices file
        assert load_prices(str(path))
        return
    values = load_toml(str(path))  # a --config file
    assert values
    serve = cli.commands["serve"]
    with click.Context(cli, info_name="payonce") as parent:
        serve.make_context("serve", ["--config", str(path)], parent=parent)


def run_promql(found: Block, workspace: Workspace) -> None:
    problems = problems_with(found.text, exported())
    assert not problems, f"{found.id}: {problems}"
    rules = {"groups": [{"name": "docs", "rules": [{"record": "docs:check", "expr": found.text}]}]}
    path = workspace.path / "rules.yml"
    path.write_text(json.dumps(rules))
    promtool = installed(["promtool"], "prometheus", required=True)
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def run_parsed(found: Block, workspace: Workspace) -> None:
    """``<!-- parsed, not run: why -->``: bash reads it, and payonce's CLI parses each
    payonce command in it (the command and every flag and value exist)."""
    assert found.marker(PARSED), f"{found.id}: say why it is not run"
    text = found.text
    if found.lang == "console":
        text = "".join(line[2:] + "\n" for line in text.splitlines() if line.startswith("$ "))
    done = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for args in payonce_commands(text):
        parse(args)


def run_figure(found: Block) -> None:
    """A figure (text, or no language): the flags and payonce commands it names exist."""
    for flag in re.findall(r"(?<![\w-])--[a-z][\w-]*", found.text):
        assert flag in options(), f"{found.id}: no payonce command has {flag}"
    for command in re.findall(r"\bpayonce ([a-z][\w-]+)", found.text):
        assert command in cli.commands, f"{found.id}: payonce has no command {command}"


RUNNERS = {"python", "sh", "console", "toml", "json", "yaml", "promql", "text", ""}


@pytest.mark.parametrize("found", _generic(), ids=lambda found: found.id)
def test_block(found: Block, workspace: Workspace, request: pytest.FixtureRequest) -> None:
    rule = _lint_rule(found)
    output = _following(found)
    if rule is not None:
        run_lint_example(found, rule, workspace)
    elif found.lang == "python":
        gateway = request.getfixturevalue("gateway") if DOC_URL in found.text else None
        printed = run_python(found, workspace, gateway)
        if output is not None:
            assert loosely_in(output.text, printed), f"{output.id}:\n{printed}"
    elif found.marker(PARSED) is not None:
        run_parsed(found, workspace)
    elif found.lang == "sh":
        done = run_sh(found.text, workspace)
        if output is not None:
            printed = done.stdout + done.stderr
            assert loosely_in(workspace.rewrite(output.text), printed), f"{output.id}:\n{printed}"
    elif found.lang == "console":
        run_console(found.text, workspace)
    elif found.lang == "toml":
        run_toml(found, workspace)
    elif found.lang == "json":
        json.loads(found.text)
    elif found.lang == "yaml":
        assert yaml.safe_load(found.text) is not None
    elif found.lang == "promql":
        run_promql(found, workspace)
    elif found.lang in {"text", ""}:
        run_figure(found)
    else:
        pytest.fail(f"{found.id}: no generic runner for {found.lang!r} blocks")
