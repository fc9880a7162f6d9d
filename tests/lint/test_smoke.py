"""The linter over real open-source packages that call the openai SDK.

Downloaded with ``pip download --no-deps`` during the test (pinned, so the
numbers in docs/lint-findings.md can be reproduced), unpacked, and linted.
Skipped only when the package registry cannot be reached.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from payonce.lint import lint_paths

PACKAGES = ["instructor==1.17.0", "langchain-openai==1.7.4", "llama-index-llms-openai==0.8.3"]
_UNREACHABLE = (
    "NewConnectionError",
    "Network is unreachable",
    "Temporary failure in name resolution",
    "Connection refused",
    "Max retries exceeded",
    "No matching distribution found",
    "Could not find a version",
    "timed out",
)


def download(target: Path) -> list[Path]:
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    result = subprocess.run(
        [*pip, "--disable-pip-version-check", "-q", "-d", str(target), *PACKAGES],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        if any(marker in result.stderr for marker in _UNREACHABLE):
            pytest.skip(f"package registry unreachable: {result.stderr.strip()[-300:]}")
        raise AssertionError(f"pip download failed: {result.stderr}")
    return sorted(target.glob("*.whl"))


@pytest.mark.slow
def test_real_packages_lint_without_crashing(tmp_path: Path) -> None:
    wheels = download(tmp_path / "wheels")
    assert len(wheels) == len(PACKAGES)
    roots = []
    for wheel in wheels:
        root = tmp_path / "src" / wheel.name.split("-")[0]
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(root)
        roots.append(str(root))

    result = lint_paths(roots, jobs=1)

    assert result.files_checked > 200
    counts = Counter(finding.code for finding in result.findings)
    assert counts["PO901"] == 0  # every file parsed
    # llama-index-llms-openai: @llm_retry_decorator (tenacity, stop_after_attempt(max_retries))
    # around SyncOpenAI(max_retries=self.max_retries): a stack the linter must see.
    llama = [
        finding
        for finding in result.findings
        if finding.path.endswith("llama_index/llms/openai/base.py")
    ]
    assert {finding.code for finding in llama} == {"PO101"}
    assert all("@llm_retry_decorator" in finding.message for finding in llama)
    by_package = Counter(
        Path(finding.path).relative_to(tmp_path / "src").parts[0] for finding in result.findings
    )
    print(f"\nfiles {result.files_checked}, by rule {dict(counts)}, by package {dict(by_package)}")
    for finding in result.findings[:5]:
        print(Path(finding.path).relative_to(tmp_path / "src"), finding.line, finding.code)
