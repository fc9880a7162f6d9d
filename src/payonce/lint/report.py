"""Writing findings as text (``path:line:col: CODE message``), JSON or SARIF 2.1.0.

The SARIF log follows the OASIS SARIF 2.1.0 schema as GitHub code scanning
reads it: one run, the tool's rules with help links, results with a
``ruleId``/``ruleIndex``, a ``level``, a physical location relative to
``%SRCROOT%`` and a ``partialFingerprints`` entry so alerts survive line moves.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path, PurePath
from typing import Any

from payonce import __version__
from payonce.lint.engine import LintResult
from payonce.lint.findings import Finding
from payonce.lint.rules import RULES

__all__ = ["render", "summary"]

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://github.com/payonce/payonce"


def render(result: LintResult, output_format: str) -> str:
    """The report in ``text``, ``json`` or ``sarif`` form."""
    if output_format == "json":
        return json.dumps(_json(result), indent=2)
    if output_format == "sarif":
        return json.dumps(_sarif(result), indent=2)
    return "\n".join(finding.text() for finding in result.findings)


def summary(result: LintResult) -> str:
    """One line for stderr: how many findings of which codes in how many files."""
    if not result.findings:
        return f"payonce lint: no findings in {result.files_checked} files"
    counts = Counter(finding.code for finding in result.findings)
    by_code = ", ".join(f"{code} {count}" for code, count in sorted(counts.items()))
    files = len({finding.path for finding in result.findings})
    return (
        f"payonce lint: {len(result.findings)} findings in {files} of"
        f" {result.files_checked} files ({by_code})"
    )


def _json(result: LintResult) -> dict[str, Any]:
    return {
        "tool": "payonce lint",
        "version": __version__,
        "files_checked": result.files_checked,
        "findings": [
            {
                "code": finding.code,
                "rule": RULES[finding.code].name,
                "level": RULES[finding.code].level.value,
                "message": finding.message,
                "path": finding.path,
                "line": finding.line,
                "column": finding.column,
                "end_line": finding.end_line or finding.line,
                "end_column": finding.end_column or finding.column,
                "help": RULES[finding.code].help_uri,
            }
            for finding in result.findings
        ],
    }


def _sarif(result: LintResult) -> dict[str, Any]:
    codes = sorted(RULES)
    index = {code: position for position, code in enumerate(codes)}
    rules = [
        {
            "id": code,
            "name": RULES[code].name,
            "shortDescription": {"text": RULES[code].summary},
            "fullDescription": {"text": RULES[code].summary},
            "helpUri": RULES[code].help_uri,
            "help": {
                "text": f"{RULES[code].summary}. See {RULES[code].help_uri}",
                "markdown": f"{RULES[code].summary}. [Rule documentation]({RULES[code].help_uri})",
            },
            "defaultConfiguration": {"level": RULES[code].level.value},
            "properties": {"tags": ["cost", "reliability", "llm"]},
        }
        for code in codes
    ]
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "payonce lint",
                        "version": __version__,
                        "semanticVersion": __version__,
                        "informationUri": INFORMATION_URI,
                        "rules": rules,
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": Path.cwd().as_uri() + "/"}},
                "results": [
                    _sarif_result(finding, index[finding.code]) for finding in result.findings
                ],
                "columnKind": "unicodeCodePoints",
            }
        ],
    }


def _sarif_result(finding: Finding, rule_index: int) -> dict[str, Any]:
    region: dict[str, int] = {"startLine": finding.line, "startColumn": finding.column}
    if finding.end_line >= finding.line:
        region["endLine"] = finding.end_line
        if finding.end_column > 0 and (
            finding.end_line > finding.line or finding.end_column >= finding.column
        ):
            region["endColumn"] = finding.end_column
    fingerprint = hashlib.sha256(
        f"{finding.code}:{finding.path}:{finding.message}".encode()
    ).hexdigest()[:32]
    return {
        "ruleId": finding.code,
        "ruleIndex": rule_index,
        "level": RULES[finding.code].level.value,
        "message": {"text": finding.message},
        "locations": [
            {
                "physicalLocation": {
                    "artifactLocation": {"uri": _uri(finding.path), "uriBaseId": "%SRCROOT%"},
                    "region": region,
                }
            }
        ],
        "partialFingerprints": {"payonceFindingHash/v1": fingerprint},
    }


def _uri(path: str) -> str:
    pure = PurePath(path)
    if pure.is_absolute():
        try:
            pure = pure.relative_to(Path.cwd())
        except ValueError:
            return Path(path).as_uri()
    return pure.as_posix().removeprefix("./")
