"""``payonce lint`` through the real entry point: exit codes, formats, select/ignore, noqa."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from payonce.cli import main
from payonce.lint import RULES
from tests.lint.conftest import FIXTURES

RETRIED = """\
from openai import OpenAI
from tenacity import retry, stop_after_attempt

client = OpenAI(max_retries=0)


@retry(stop=stop_after_attempt(3))
def ask(prompt):
    return client.chat.completions.create(model="m", messages=[]){noqa}
"""


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(["lint", *args])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    else:
        code = 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def retried(tmp_path: Path) -> Path:
    path = tmp_path / "app.py"
    path.write_text(RETRIED.format(noqa=""))
    return path


def test_findings_exit_1_with_path_line_col_code(
    retried: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run([str(retried)], capsys)
    assert code == 1
    assert out.splitlines() == [
        f"{retried}:9:12: PO201 chat.completions.create() is retried by tenacity @retry on line 7"
        " (3 attempts) without an idempotency key: every attempt is billed again; pass"
        ' extra_headers={"Idempotency-Key": key} with a key made once per request, outside the'
        " retry"
    ]
    assert err.strip() == "payonce lint: 1 findings in 1 of 1 files (PO201 1)"


def test_clean_tree_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ok.py").write_text("from openai import OpenAI\nOpenAI(max_retries=0)\n")
    code, out, err = run([str(tmp_path)], capsys)
    assert (code, out) == (0, "")
    assert "no findings in 1 files" in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["/no/such/path"], "/no/such/path: no such file or directory"),
        (["--select", "PO7", "."], "--select: unknown rule code or prefix 'PO7'"),
        (["--ignore", "XX1", "."], "--ignore: unknown rule code or prefix 'XX1'"),
        (["--format", "xml", "."], "--format"),
        ([], "PATH"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(args, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("payonce: error:") and needle in lines[0]
    assert "Traceback" not in err


def test_subprocess_exit_codes_and_no_traceback(retried: Path, tmp_path: Path) -> None:
    def payonce(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "payonce", "lint", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "PYTHONWARNINGS": "error"},
        )

    assert payonce(str(retried)).returncode == 1
    clean = tmp_path / "clean"
    clean.mkdir()
    assert payonce(str(clean)).returncode == 0
    missing = payonce(str(tmp_path / "missing"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


@pytest.mark.parametrize(
    ("flags", "codes"),
    [
        ([], ["PO101", "PO201", "PO202"]),
        (["--select", "PO2"], ["PO201", "PO202"]),
        (["--select", "po101,PO202"], ["PO101", "PO202"]),
        (["--ignore", "PO2"], ["PO101"]),
        (["--select", "PO1", "--select", "PO2", "--ignore", "PO202"], ["PO101", "PO201"]),
        (["--ignore", "PO"], []),
    ],
)
def test_select_and_ignore(
    flags: list[str], codes: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "app.py"
    path.write_text(RETRIED.format(noqa="").replace("OpenAI(max_retries=0)", "OpenAI()"))
    code, out, _ = run([*flags, str(path)], capsys)
    assert sorted(line.split()[1] for line in out.splitlines()) == codes
    assert code == (1 if codes else 0)


@pytest.mark.parametrize(
    ("noqa", "suppressed"),
    [
        ("  # noqa", True),
        ("  # noqa: PO201", True),
        ("  # NOQA:PO2", True),
        ("  # noqa: E501, PO201", True),
        ("  # noqa: PO101", False),
        ("  # noqa: E501", False),
        ("  # a comment, not a suppression", False),
    ],
)
def test_noqa(
    noqa: str, suppressed: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "app.py"
    path.write_text(RETRIED.format(noqa=noqa))
    code, out, _ = run([str(path)], capsys)
    assert (code == 0) is suppressed
    assert ("PO201" not in out) is suppressed


def test_noqa_on_the_closing_line_of_a_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "app.py"
    source = RETRIED.format(noqa="").replace(
        'create(model="m", messages=[])',
        'create(\n        model="m", messages=[]\n    )  # noqa: PO201',
    )
    path.write_text(source)
    code, _, _ = run([str(path)], capsys)
    assert code == 0


def test_noqa_in_config_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (FIXTURES / "configs/litellm_config.yaml").read_text()
    path = tmp_path / "litellm.yaml"
    path.write_text(
        text.replace("num_retries: 3  # expect: PO503", "num_retries: 3  # noqa: PO503")
    )
    _, out, _ = run(["--select", "PO503", str(path)], capsys)
    assert len(out.splitlines()) == 2


def test_json_format(retried: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--format", "json", str(retried)], capsys)
    report = json.loads(out)
    assert code == 1
    assert report["files_checked"] == 1
    (finding,) = report["findings"]
    assert finding["code"] == "PO201"
    assert finding["rule"] == "app-retry-without-key"
    assert (finding["line"], finding["column"], finding["end_line"]) == (9, 12, 9)
    assert finding["help"].endswith("docs/lint-rules.md#po201")


def test_output_file(retried: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "report.json"
    code, out, _ = run(["--format", "json", "-o", str(report), str(retried)], capsys)
    assert (code, out) == (1, "")
    assert json.loads(report.read_text())["findings"][0]["code"] == "PO201"


def check_sarif(log: dict[str, Any]) -> None:
    """The parts of the SARIF 2.1.0 schema GitHub code scanning requires, checked by hand."""
    assert log["version"] == "2.1.0"
    assert log["$schema"].endswith("sarif-2.1.0.json")
    (run_,) = log["runs"]
    driver = run_["tool"]["driver"]
    assert driver["name"] and driver["version"]
    rule_ids = [rule["id"] for rule in driver["rules"]]
    assert rule_ids == sorted(RULES)
    for rule in driver["rules"]:
        assert rule["shortDescription"]["text"]
        assert rule["helpUri"].startswith("https://")
        assert rule["defaultConfiguration"]["level"] in {"error", "warning", "note", "none"}
    for result in run_["results"]:
        assert result["ruleId"] == rule_ids[result["ruleIndex"]]
        assert result["level"] in {"error", "warning", "note", "none"}
        assert result["message"]["text"]
        (location,) = result["locations"]
        artifact = location["physicalLocation"]["artifactLocation"]
        assert not artifact["uri"].startswith("/") and "\\" not in artifact["uri"]
        assert artifact["uriBaseId"] == "%SRCROOT%"
        region = location["physicalLocation"]["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1
        assert region.get("endLine", region["startLine"]) >= region["startLine"]
        assert result["partialFingerprints"]
    assert run_["originalUriBaseIds"]["%SRCROOT%"]["uri"].endswith("/")


def test_sarif_format(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(FIXTURES.parent.parent.parent)
    code, out, _ = run(["--format", "sarif", "tests/lint/fixtures"], capsys)
    log = json.loads(out)
    assert code == 1
    check_sarif(log)
    results = log["runs"][0]["results"]
    assert {result["ruleId"] for result in results} >= set(RULES) - {"PO901"}
    uris = {
        result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for result in results
    }
    assert "tests/lint/fixtures/configs/envoy.yaml" in uris


def test_sarif_when_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--format", "sarif", str(tmp_path)], capsys)
    log = json.loads(out)
    assert code == 0 and log["runs"][0]["results"] == []
    check_sarif(log)


def test_help_lists_every_rule(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    for rule in RULES:
        assert rule in out


def test_precommit_hook_runs_payonce_lint() -> None:
    from payonce.lint.yaml_subset import parse_documents

    (hooks,) = parse_documents((FIXTURES.parents[2] / ".pre-commit-hooks.yaml").read_text())
    (hook,) = hooks.items()
    values = (
        {key: node.value for key, node in hook.value.items()}
        if isinstance(hook.value, dict)
        else {}
    )
    assert values["id"] == "payonce-lint"
    assert values["entry"] == "payonce lint"
    assert values["language"] == "python"
