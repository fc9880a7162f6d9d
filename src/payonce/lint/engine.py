"""Finding the files, running the rules on each, in parallel when there are many.

No user code is imported or run: Python files are parsed with :mod:`ast`,
configuration files are read as text.
"""

from __future__ import annotations

import ast
import gc
import multiprocessing
import os
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from payonce.errors import ConfigError
from payonce.lint.analyzer import analyze_module
from payonce.lint.config_files import check_nginx, check_yaml, is_nginx_text, is_proxy_yaml_text
from payonce.lint.findings import Finding
from payonce.lint.noqa import apply_noqa
from payonce.lint.rules import RuleSelection

__all__ = ["DEFAULT_EXCLUDES", "FileKind", "LintResult", "discover", "lint_file", "lint_paths"]

DEFAULT_EXCLUDES = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        ".eggs",
        "node_modules",
        "__pycache__",
        "__pypackages__",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        "site-packages",
    }
)
# Below this many files, starting worker processes costs more than it saves.
PARALLEL_THRESHOLD = 200
_CHUNK = 64


class FileKind(Enum):
    PYTHON = "python"
    YAML = "yaml"
    NGINX = "nginx"
    UNKNOWN = "unknown"  # named explicitly on the command line: sniffed by content


@dataclass(frozen=True, slots=True)
class LintResult:
    """What one run found, sorted by path, line, column and code."""

    findings: tuple[Finding, ...]
    files_checked: int


def kind_of(path: Path) -> FileKind | None:
    """The kind of file a directory walk picks up, or None to skip it."""
    suffix = path.suffix.lower()
    if suffix == ".py":
        return FileKind.PYTHON
    if suffix in {".yaml", ".yml"}:
        return FileKind.YAML
    if suffix in {".conf", ".nginx"} or path.name == "nginx.conf":
        return FileKind.NGINX
    return None


def discover(
    paths: Iterable[str], excludes: frozenset[str] = DEFAULT_EXCLUDES
) -> list[tuple[str, FileKind]]:
    """The files under ``paths``; a path that does not exist is a :class:`ConfigError`."""
    found: list[tuple[str, FileKind]] = []
    for given in paths:
        path = Path(given)
        if path.is_file():
            found.append((given, kind_of(path) or FileKind.UNKNOWN))
        elif path.is_dir():
            found.extend(_walk(given, excludes))
        else:
            raise ConfigError(f"{given}: no such file or directory")
    seen: set[str] = set()
    unique = []
    for name, kind in found:
        if name not in seen:
            seen.add(name)
            unique.append((name, kind))
    return unique


def _walk(root: str, excludes: frozenset[str]) -> list[tuple[str, FileKind]]:
    found = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(
            name
            for name in subdirectories
            if name not in excludes and not name.endswith(".egg-info")
        )
        for name in sorted(files):
            kind = kind_of(Path(name))
            if kind is not None:
                found.append((os.path.join(directory, name), kind))
    return found


def lint_file(path: str, kind: FileKind) -> list[Finding]:
    """Every finding in one file, ``# noqa`` applied, before ``--select``/``--ignore``."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        code = "PO901" if kind is FileKind.PYTHON else "PO902"
        return [Finding(path, 1, 1, code, f"could not read the file: {exc.strerror or exc}", 1, 1)]
    text = data.decode("utf-8", errors="replace")
    if kind is FileKind.UNKNOWN:
        kind = _sniff(path, text)
    if kind is FileKind.PYTHON:
        findings = _lint_python(data, path)
    elif kind is FileKind.YAML:
        findings = check_yaml(text, path) if is_proxy_yaml_text(text) else []
    elif kind is FileKind.NGINX:
        findings = check_nginx(text, path) if is_nginx_text(text) else []
    else:
        findings = []
    return apply_noqa(findings, text) if findings else findings


def _sniff(path: str, text: str) -> FileKind:
    first = text.split("\n", 1)[0]
    if first.startswith("#!") and "python" in first:
        return FileKind.PYTHON
    if is_nginx_text(text) and "{" in text:
        return FileKind.NGINX
    if is_proxy_yaml_text(text):
        return FileKind.YAML
    return FileKind.UNKNOWN


# The analyzer only reports around LLM calls, and it can only recognise one in
# a module that imports an LLM SDK or spells an LLM URL. Modules with neither
# are only parsed (for PO901): most of a code base, and most of the run time.
# The Agents SDK's ModelSettings(retry=...) is a retry layer of its own.
_MAY_CALL_AN_LLM = re.compile(
    rb"openai|anthropic|litellm|langchain|Model(?:Retry)?Settings"
    rb"|/(?:v1/)?(?:chat/completions|completions|messages|responses)\b"
)


def _lint_python(data: bytes, path: str) -> list[Finding]:
    try:
        # Bytes, so a PEP 263 coding cookie is honoured as the interpreter would.
        tree = ast.parse(data, filename=path)
    except SyntaxError as exc:
        line = exc.lineno or 1
        column = exc.offset or 1
        return [Finding(path, line, column, "PO901", f"syntax error: {exc.msg}", line, column)]
    except (ValueError, UnicodeDecodeError, RecursionError, MemoryError) as exc:
        return [Finding(path, 1, 1, "PO901", f"could not parse: {exc}", 1, 1)]
    if _MAY_CALL_AN_LLM.search(data) is None:
        return []
    try:
        return analyze_module(tree, path)
    except RecursionError:
        # A pathologically nested module: better one honest finding than a crash.
        return [Finding(path, 1, 1, "PO901", "too deeply nested to analyse", 1, 1)]
    except Exception as exc:  # noqa: BLE001 - one odd file must not abort a CI run
        message = f"not analysed, internal error in payonce lint (please report): {exc!r}"
        return [Finding(path, 1, 1, "PO901", message, 1, 1)]


def _lint_chunk(chunk: Sequence[tuple[str, FileKind]]) -> list[Finding]:
    findings: list[Finding] = []
    # Syntax trees hold no reference cycles, so reference counting frees them;
    # the cyclic collector only re-scans them (measured: ~15% of a run).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for path, kind in chunk:
            findings.extend(lint_file(path, kind))
    finally:
        if was_enabled:
            gc.enable()
    return findings


def lint_paths(
    paths: Iterable[str],
    selection: RuleSelection | None = None,
    *,
    jobs: int | None = None,
    excludes: frozenset[str] = DEFAULT_EXCLUDES,
) -> LintResult:
    """Lint files and directories; ``jobs`` worker processes (default: one per CPU)."""
    files = discover(paths, excludes)
    jobs = jobs if jobs is not None else (os.cpu_count() or 1)
    if jobs > 1 and len(files) >= PARALLEL_THRESHOLD and _can_fork():
        chunks = [files[start : start + _CHUNK] for start in range(0, len(files), _CHUNK)]
        # fork: workers inherit the parsed modules; spawn would re-run the caller's __main__.
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            results = [finding for chunk in pool.map(_lint_chunk, chunks) for finding in chunk]
    else:
        results = _lint_chunk(files)
    chosen = selection or RuleSelection.everything()
    kept = sorted(finding for finding in results if finding.code in chosen)
    return LintResult(tuple(kept), len(files))


def _can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()
