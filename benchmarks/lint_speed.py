"""How long ``payonce lint`` takes over 10,000 Python files.

Generates a tree of modules with realistic sizes (log-normal, median ~4 KB,
300 B to 60 KB, like a large application's source tree), one in twenty of
which calls an LLM SDK (some inside tenacity retries, some with short
timeouts), then times the real command line, ``payonce lint DIR``, with the
default worker count and with ``-j 1``. Results go to stdout; the measured
numbers are recorded in benchmarks/NOTEBOOK.md ("payonce lint speed").

    .venv/bin/python benchmarks/lint_speed.py [--files 10000] [--seed 7] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FUNCTION = '''

def {name}({args}):
    """{doc}"""
    total = 0
    for index, item in enumerate({first}):
        if item is None:
            continue
        try:
            total += len(str(item)) * index
        except (TypeError, ValueError) as exc:
            raise RuntimeError("{name}: bad item") from exc
    result = {{"name": "{name}", "total": total, "items": [x for x in {first} if x]}}
    return result
'''

CLASS = '''

class {name}:
    """{doc}"""

    def __init__(self, {args}):
        self.values = [{args}]
        self.cache = {{}}

    def compute(self, key):
        if key in self.cache:
            return self.cache[key]
        value = sum(hash(v) % 97 for v in self.values if v is not None)
        self.cache[key] = value
        return value

    def __repr__(self):
        return f"{name}(values={{self.values!r}})"
'''

LLM_RETRIED = """
from openai import OpenAI
from tenacity import retry, stop_after_attempt

client = OpenAI(timeout=10)


@retry(stop=stop_after_attempt(4))
def summarise_{index}(text):
    messages = [{{"role": "user", "content": text}}]
    return client.chat.completions.create(model="gpt-4o-mini", messages=messages)
"""

LLM_CLEAN = """
import httpx
import openai

client = openai.OpenAI(max_retries=0, timeout=httpx.Timeout(60, connect=5))


def classify_{index}(text, key):
    return client.chat.completions.create(
        model="gpt-4o-mini", messages=[], extra_headers={{"Idempotency-Key": key}}
    )
"""

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "order",
    "invoice",
    "ticket",
    "user",
    "account",
    "report",
    "batch",
    "queue",
]


def module_text(rng: random.Random, index: int) -> str:
    target = int(min(max(rng.lognormvariate(8.3, 0.9), 300), 60_000))  # e^8.3 ~ 4 KB
    parts = [f'"""Generated module {index}."""\n\nimport json\nimport os\n']
    if index % 20 == 0:
        parts.append((LLM_RETRIED if index % 40 == 0 else LLM_CLEAN).format(index=index))
    size = sum(map(len, parts))
    block = 0
    while size < target:
        name = f"{rng.choice(WORDS)}_{index}_{block}"
        args = ", ".join(rng.sample(WORDS, rng.randint(1, 4)))
        template = CLASS if rng.random() < 0.3 else FUNCTION
        text = template.format(
            name=name.title().replace("_", "") if template is CLASS else name,
            args=args,
            first=args.split(", ")[0],
            doc=" ".join(rng.choices(WORDS, k=12)),
        )
        parts.append(text)
        size += len(text)
        block += 1
    return "".join(parts)


def generate(root: Path, files: int, seed: int) -> int:
    rng = random.Random(seed)
    total = 0
    for index in range(files):
        directory = root / f"package_{index // 100:03d}"
        directory.mkdir(parents=True, exist_ok=True)
        text = module_text(rng, index)
        (directory / f"module_{index:05d}.py").write_text(text)
        total += len(text)
    return total


def time_lint(root: Path, *extra: str) -> tuple[float, str]:
    command = [sys.executable, "-m", "payonce", "lint", "-q", *extra, str(root)]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if result.returncode not in (0, 1):
        raise SystemExit(f"payonce lint failed: {result.stderr}")
    return elapsed, f"{len(result.stdout.splitlines())} findings"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", type=Path, default=None, help="generate here and keep it")
    options = parser.parse_args()
    root = options.keep or Path(tempfile.mkdtemp(prefix="payonce-lint-speed-"))
    try:
        size = generate(root, options.files, options.seed)
        print(f"{options.files} files, {size / 1e6:.1f} MB, in {root}; {os.cpu_count()} CPUs")
        for label, extra in [("default jobs", ()), ("-j 1", ("-j", "1"))]:
            runs = [time_lint(root, *extra) for _ in range(3)]
            best = min(elapsed for elapsed, _ in runs)
            median = sorted(elapsed for elapsed, _ in runs)[1]
            print(f"payonce lint ({label}): best {best:.2f} s, median {median:.2f} s, {runs[0][1]}")
    finally:
        if options.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
