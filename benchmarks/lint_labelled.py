"""Precision and recall of ``payonce lint`` on the labelled real findings.

Downloads the pinned wheels of ``tests/lint/labelled/findings.csv`` with
``pip download --no-deps``, unpacks them, lints them in-process and compares
the findings with the labels: TP and FP rows are findings read by hand, FN
rows are retries around an LLM call found by reading that the linter misses.
A finding with no label, or a labelled finding no longer reported, is listed:
the labels then need reading again. The figures are in docs/lint-findings.md.

    .venv/bin/python -m benchmarks.lint_labelled [--keep DIR]
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from payonce.lint import lint_paths

LABELS = Path(__file__).resolve().parents[1] / "tests" / "lint" / "labelled" / "findings.csv"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="download and unpack here (reused if present)")
    options = parser.parse_args()
    rows = list(csv.DictReader(LABELS.open()))
    pins = sorted({f"{row['package']}=={row['version']}" for row in rows})
    with tempfile.TemporaryDirectory() as scratch:
        root = options.keep or Path(scratch)
        found = lint_pinned(pins, root)
    labelled = {(row["package"], row["file"], int(row["line"]), row["code"]): row for row in rows}
    reported = {key for key in labelled if labelled[key]["label"] in {"TP", "FP"}}
    true_positives = sum(1 for key in found if labelled.get(key, {}).get("label") == "TP")
    false_positives = sum(1 for key in found if labelled.get(key, {}).get("label") == "FP")
    false_negatives = sum(1 for row in rows if row["label"] == "FN")
    for key in sorted(found - set(labelled)):
        print("unlabelled finding:", *key)
    for key in sorted(reported - found):
        print("labelled finding no longer reported:", *key)
    for key in sorted(found & {k for k, row in labelled.items() if row["label"] == "FN"}):
        print("known false negative now found:", *key)
    precision = true_positives / max(true_positives + false_positives, 1)
    recall = true_positives / max(true_positives + false_negatives, 1)
    print(
        f"{len(found)} findings in {len(pins)} packages: TP {true_positives}, FP {false_positives},"
        f" known FN {false_negatives}; precision {precision:.0%}, recall {recall:.0%}"
    )
    return 0


def lint_pinned(pins: list[str], root: Path) -> set[tuple[str, str, int, str]]:
    """``(package, file, line, code)`` of every finding in the pinned wheels."""
    wheels = root / "wheels"
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q"]
    subprocess.run([*pip, "-d", str(wheels), *pins], check=True)
    found: set[tuple[str, str, int, str]] = set()
    for pin in pins:
        package, version = pin.split("==")
        prefix = f"{package.replace('-', '_')}-{version}-"
        (wheel,) = [path for path in wheels.glob("*.whl") if path.name.startswith(prefix)]
        unpacked = root / "src" / wheel.stem
        if not unpacked.exists():
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(unpacked)
        for finding in lint_paths([str(unpacked)], jobs=1).findings:
            relative = Path(finding.path).relative_to(unpacked).as_posix()
            found.add((package, relative, finding.line, finding.code))
    return found


if __name__ == "__main__":
    raise SystemExit(main())
