"""The container image (deploy/Containerfile), built and driven with the openai SDK.

The base is made from Debian packages (no registry is reachable here) and both
images are reused while podman has them (tests/support/container.py). The
gateway runs as in docs/deploy.md: read-only root file system, the store and
the call log on a volume; a keyed call, its replay, a restart with the volume
kept, and the replay still there.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import openai
import pytest

from tests.support import apt, prepare
from tests.support.container import PODMAN, gateway_image
from tests.support.processes import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

# This machine refuses podman's default rlimits (higher than its own hard limits).
LIMITS = ("--ulimit", "nofile=8192:8192", "--ulimit", "nproc=8192:8192")


def _podman(*args: str, check: bool = True) -> str:
    done = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args[:3])}: {done.stderr[-2000:]}")
    return done.stdout


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    # Built by tests.support.prepare before the tests (this only finds it), or
    # here if that failed to: the test fails with its reason, it never skips.
    failed = prepare.failed("tests/deploy/test_container.py")
    if failed is not None:
        pytest.fail(f"the image could not be built: {failed}")
    apt.installed(("podman",), "podman", required=True)
    apt.installed(("runc",), "runc", required=True)
    mmdebstrap = apt.installed(("mmdebstrap",), "mmdebstrap", required=True)
    return gateway_image(tmp_path_factory.mktemp("image") / "build.log", mmdebstrap)


@pytest.fixture
def volume() -> Iterator[str]:
    name = f"payonce-test-{uuid.uuid4().hex[:12]}"
    _podman("volume", "create", name)
    yield name
    _podman("volume", "rm", "--force", name, check=False)


def _start(image: str, volume: str, port: int) -> str:
    name = f"payonce-test-{uuid.uuid4().hex[:12]}"
    _podman(
        "run", "--detach", "--name", name, "--network", "host", "--read-only", *LIMITS,
        "--volume", f"{volume}:/var/lib/payonce",
        "--env", f"PAYONCE_PORT={port}",
        "--env", "PAYONCE_UPSTREAM=sim",
        "--env", f"PAYONCE_SIM_PORT={free_port()}",
        image,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(url + "/_payonce/health/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, "the gateway in its container", timeout=60)
    except BaseException:
        print(_podman("logs", name, check=False))
        _podman("rm", "--force", name, check=False)
        raise
    return name


def _call(url: str) -> tuple[str, str | None]:
    with openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "bill me once"}],
            extra_headers={"Idempotency-Key": "container-1"},
        )
    return raw.parse().model_dump_json(), raw.headers.get("idempotent-replayed")


def test_the_image_serves_replays_and_keeps_them_across_a_restart(image: str, volume: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    first = _start(image, volume, port)
    try:
        assert _podman("exec", first, "id", "-u").strip() != "0", "runs as root"
        touch = subprocess.run([*PODMAN, "exec", first, "touch", "/opt/x"], capture_output=True)
        assert touch.returncode != 0 and b"Read-only file system" in touch.stderr
        assert (
            _podman("inspect", first, "--format", "{{.HostConfig.ReadonlyRootfs}}").strip()
            == "true"
        )
        original, replayed = _call(url)
        assert replayed == "false"
        again, replayed = _call(url)
        assert (again, replayed) == (original, "true")
        assert subprocess.run([*PODMAN, "healthcheck", "run", first], timeout=60).returncode == 0
        _podman("stop", "--time", "30", first)
        assert _podman("inspect", first, "--format", "{{.State.ExitCode}}").strip() == "0"
    finally:
        _podman("rm", "--force", first, check=False)
    second = _start(image, volume, port)
    try:
        after, replayed = _call(url)
        assert (after, replayed) == (original, "true"), "the volume kept the record"
    finally:
        _podman("stop", "--time", "30", second, check=False)
        _podman("rm", "--force", second, check=False)
    mountpoint = Path(_podman("volume", "inspect", volume, "--format", "{{.Mountpoint}}").strip())
    assert (mountpoint / "payonce.db").exists()
    lines = [json.loads(line) for line in (mountpoint / "calls.jsonl").read_text().splitlines()]
    assert [line["outcome"] for line in lines] == ["forwarded", "replayed", "replayed"]
