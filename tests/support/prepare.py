"""What the suite needs besides payonce's own virtualenv, prepared on the terminal that asked.

``python -m tests.support.prepare`` (``make test`` runs it before pytest):

1. the Debian packages of the programs the tests run (:data:`tests.support.apt.PROGRAMS`:
   Redis, PostgreSQL, PgBouncer, Prometheus, gcc, wrk, podman, Chromium, and g++ for
   step 6), installed with apt when missing (as root; otherwise a required one
   missing fails here, an optional one is reported and its tests skip);
2. LiteLLM's virtualenv for ``tests/upstreams/test_litellm.py`` (about 3 minutes
   the first time);
3. older SDK releases for ``tests/client/test_sdk_versions.py`` (seconds: tests/support/sdks.py);
4. the frameworks of docs/recipes.md for ``tests/recipes/`` (two virtualenvs and
   the openai Node SDK: about a minute the first time, ``tests/support/frameworks.py``);
5. the gateway's container image for ``tests/deploy/test_container.py`` (about
   2 minutes the first time: tests/support/container.py);
6. llama.cpp's server for ``tests/upstreams/test_llama_cpp.py`` (a first build of
   llama-cpp-python: about 15 minutes of CPU on 2 cores, up to 30 on busy ones).

One line per step: what, for which tests, how long it took, and where its log is
when there was work; a slow step says what it starts before it starts. When all
is ready it takes a second or two. On a failure it stops and exits 1 with one
line: the step, the reason, the log.

Run by pytest itself, without ``make`` (:func:`prepare_for_tests`, called from
``tests/conftest.py``), steps 2 to 6 are done before the first test when a
selected test needs them; under xdist by the controller, whose terminal is the
one that shows it (a worker's output is never shown), before any test is handed
out. Workers never build llama.cpp: they take what was prepared.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tests.support import apt, container, frameworks, litellm, llama_cpp, sdks

__all__ = ["FAILED", "STEPS", "Step", "failed", "main", "prepare_for_tests", "run"]

ROOT = Path(__file__).resolve().parents[2]
# The whole message of a step that failed (the terminal gets its first line).
LOG = ROOT / ".venv" / "prepare.log"

Say = Callable[[str], object]


@dataclass(frozen=True)
class Step:
    what: str
    why: str  # who needs it
    tests: str  # the test file that needs it, "" for several
    log: Path | None  # where its own output goes, if anywhere
    make: Callable[[Say], str]  # what it did: "ready", "installed", ...


def _program(program: apt.Program) -> Step:
    def make(say: Say) -> str:
        if apt.find(program.commands):
            return "ready"
        if apt.usable():
            say(f"prepare: installing Debian package {program.package} (seconds to minutes)")
        try:
            return f"installed: {apt.ensure(program.commands, program.package)}"
        except apt.Unavailable as exc:
            if program.required:
                raise
            return f"skipped, its tests skip: {exc}"

    what = f"{program.commands[0]} (Debian package {program.package})"
    return Step(what, program.why, "", None, make)


def _litellm(say: Say) -> str:
    return "installed" if litellm.prepare(say).created else "ready"


def _recipes(what: frameworks.VirtualEnv | frameworks.NodeSDK) -> Callable[[Say], str]:
    def make(say: Say) -> str:
        return "installed" if frameworks.prepare(what, say).created else "ready"

    return make


def _llama(say: Say) -> str:
    made = llama_cpp.prepare(say)
    return "built and installed" if made.built else "installed" if made.made else "ready"


STEPS = (
    *(_program(program) for program in apt.PROGRAMS),
    Step(
        f"LiteLLM proxy {litellm.LITELLM_VERSION} ({litellm.HOME.relative_to(ROOT)})",
        "payonce in front of LiteLLM",
        "tests/upstreams/test_litellm.py",
        litellm.LOG,
        _litellm,
    ),
    *(
        Step(
            f"{what.name} for the recipes ({what.home.relative_to(ROOT)})",
            "docs/recipes.md, run end to end",
            tests,
            what.log,
            _recipes(what),
        )
        for what, tests in (
            (frameworks.FRAMEWORKS, "tests/recipes/test_frameworks.py"),
            (frameworks.OPENAI2, "tests/recipes/test_openai2_frameworks.py"),
            (frameworks.NODE, "tests/recipes/test_node_sdk.py"),
        )
    ),
    Step(
        f"older SDK releases ({sdks.HOME.relative_to(ROOT)}: "
        + ", ".join(f"{sdk.package} {sdk.version}" for sdk in sdks.SDKS)
        + ")",
        "payonce run, payonce.auto and protect() on them",
        "tests/client/test_sdk_versions.py",
        sdks.LOG,
        sdks.prepare_all,
    ),
    Step(
        "the gateway's container image (podman, its base from Debian packages)",
        "the image driven with the openai SDK",
        "tests/deploy/test_container.py",
        container.LOG,
        container.prepare,
    ),
    Step(
        f"llama.cpp's server ({llama_cpp.HOME.relative_to(ROOT)})",
        "payonce in front of a real model",
        "tests/upstreams/test_llama_cpp.py",
        llama_cpp.LOG,
        _llama,
    ),
)

# Steps run by pytest in this process that failed, by name: their tests fail
# with this message instead of trying again (a build longer than a test's timeout).
FAILED: dict[str, str] = {}


def run(step: Step, say: Say) -> bool:
    """Run one step, saying how it went in one line; False when it failed."""
    started = time.monotonic()
    try:
        outcome = step.make(say)
    except Exception as exc:
        message = str(exc)
        LOG.parent.mkdir(parents=True, exist_ok=True)
        LOG.write_text(f"{step.what}, for {step.why}:\n{message}\n")
        FAILED[step.what] = message
        lines = [line.strip() for line in message.splitlines() if line.strip()]
        # The first line says what failed; with a log's tail below it, the last
        # says why (pip's "ERROR: ...", apt's "E: ...").
        reason = lines[0].rstrip(":") if lines else type(exc).__name__
        if len(lines) > 1:
            reason += f": {lines[-1]}"
        log = step.log if step.log is not None and step.log.exists() else LOG
        say(f"prepare: {step.what} FAILED: {reason} (log: {log})")
        return False
    seconds = time.monotonic() - started
    line = f"prepare: {step.what}, for {step.why}: {outcome} in {seconds:.1f} s"
    if outcome != "ready" and step.log is not None:
        line += f" (log: {step.log})"
    say(line)
    return True


def failed(tests: str) -> str | None:
    """Why the step for this test file failed in this process, if it did."""
    return next((FAILED[s.what] for s in STEPS if s.tests == tests and s.what in FAILED), None)


def prepare_for_tests(nodeids: Iterable[str], say: Say) -> None:
    """The steps some of these tests need (a test file's), run once in this process."""
    files = {nodeid.split("::", 1)[0] for nodeid in nodeids}
    for step in STEPS:
        if step.tests in files and step.what not in FAILED:
            run(step, say)


def main() -> int:
    started = time.monotonic()

    def say(line: str) -> None:
        print(line, flush=True)

    for step in STEPS:
        if not run(step, say):
            return 1
    say(f"prepare: all ready in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
