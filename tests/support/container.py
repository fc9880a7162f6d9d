"""The gateway's container image for tests/deploy/, built once per machine and reused.

No registry is reachable here, so the base image is made from Debian packages
(mmdebstrap, then ``podman import``) and passed to deploy/Containerfile as its
BASE. Both are tagged by a hash of what they are made of and reused while
podman's storage has them: the base by its package list and the machine's CA
bundle (the build reaches PyPI through it), the image by the base and the files
the build copies (the Containerfile, the lock, the sources).
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.support import apt

__all__ = [
    "BASE_PACKAGES",
    "LOG",
    "PODMAN",
    "base_image",
    "gateway_image",
    "image_key",
    "prepare",
]

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / ".venv" / "container-build.log"
# runc: the runtime that works on these machines (crun does not).
PODMAN = ("podman", "--runtime", "runc")
SUITE = "bookworm"  # Python 3.11
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# What the build copies (.containerignore lets nothing else in).
_INPUTS = ("deploy/Containerfile", ".containerignore", "pyproject.toml", "uv.lock", "README.md")


def _run(args: list[str], log: Path | None = None, timeout: float = 900) -> None:
    out = log.open("ab") if log is not None else subprocess.DEVNULL
    try:
        done = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    finally:
        if log is not None:
            out.close()  # type: ignore[union-attr]
    if done.returncode != 0:
        where = f", see {log}" if log is not None else ""
        raise RuntimeError(f"{' '.join(args[:4])} … failed ({done.returncode}){where}")


def _exists(tag: str) -> bool:
    if not tag:
        return False
    return subprocess.run([*PODMAN, "image", "exists", tag], check=False).returncode == 0


def _base_tag() -> str:
    digest = hashlib.sha256(SUITE.encode() + " ".join(BASE_PACKAGES).encode())
    if CA_BUNDLE.exists():
        digest.update(CA_BUNDLE.read_bytes())
    return f"localhost/payonce-test-base:{digest.hexdigest()[:16]}"


def base_image(log: Path, mmdebstrap: str) -> str:
    """The tag of the Debian base with Python, built if podman does not have it."""
    tag = _base_tag()
    if _exists(tag):
        return tag
    tar = log.parent / "base.tar"
    hooks = []
    if CA_BUNDLE.exists():
        # The machine's CA bundle, so that pip and uv reach PyPI from inside the build
        # as they do here (a base image of one's own carries its CA the same way).
        hooks = [f"--customize-hook=copy-in {CA_BUNDLE} {CA_BUNDLE.parent}"]
    _run(
        [
            mmdebstrap,
            "--variant=apt",
            f"--include={','.join(BASE_PACKAGES)}",
            *hooks,
            "--format=tar",
            SUITE,
            str(tar),
        ],
        log,
    )
    try:
        _run([*PODMAN, "import", str(tar), tag], log)
    finally:
        tar.unlink(missing_ok=True)
    return tag


def image_key(base: str) -> str:
    """A hash of the base and of every file the image is built from."""
    digest = hashlib.sha256(base.encode())
    files = [ROOT / name for name in _INPUTS] + [ROOT / "requirements/uv.txt"]
    files += sorted(
        p for p in (ROOT / "src").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def gateway_image(log: Path, mmdebstrap: str) -> str:
    """The tag of the gateway's image built from this checkout on the Debian base."""
    base = base_image(log, mmdebstrap)
    tag = f"localhost/payonce-test:{image_key(base)}"
    if _exists(tag):
        return tag
    _run(
        [
            *PODMAN,
            "build",
            "--network",
            "host",
            "--format",
            "docker",  # HEALTHCHECK is kept only in the docker format
            "--build-arg",
            f"BASE={base}",
            "--file",
            str(ROOT / "deploy/Containerfile"),
            "--tag",
            tag,
            str(ROOT),
        ],
        log,
    )
    _forget_other_builds(tag)
    return tag


def _forget_other_builds(tag: str) -> None:
    """Remove the images of earlier checkouts (one per change to src/) made over an hour ago.

    Not the recent ones: another checkout's test run on this machine may be using
    its own. ``podman rmi`` takes their cached build steps along.
    """
    repository = tag.split(":")[0]
    listed = subprocess.run(
        [
            *PODMAN,
            "images",
            "--filter",
            f"reference={repository}",
            "--filter",
            "until=1h",
            "--format",
            "{{.Repository}}:{{.Tag}}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    old = [name for name in listed.stdout.split() if name != tag]
    if old:
        subprocess.run([*PODMAN, "rmi", *old], capture_output=True, check=False)


def prepare(say: Callable[[str], object]) -> str:
    """For ``python -m tests.support.prepare``: the image, built when podman lacks it."""
    for program in ("podman", "runc", "mmdebstrap"):
        apt.ensure((program,), program)
    mmdebstrap = apt.ensure(("mmdebstrap",), "mmdebstrap")
    if _exists(_built_tag()):
        return "ready"
    say(f"prepare: building the gateway's container image (1-2 minutes the first time); log: {LOG}")
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text("")
    return f"built {gateway_image(LOG, mmdebstrap)}"


def _built_tag() -> str:
    """The image's tag if its base is there (without the base, it cannot be either)."""
    base = _base_tag()
    return f"localhost/payonce-test:{image_key(base)}" if _exists(base) else ""
