"""The docs blocks the generic runner cannot run as they are, run here with what they
need: a TLS gateway, a port already taken, an application for ``payonce run``, a
project to lint, Redis over TLS, PostgreSQL, a call log and its bill."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import block
from tests.docs.runner import Workspace, loosely_in, run_console, run_sh
from tests.reconcile import data
from tests.support.postgres import running_postgres
from tests.support.processes import Process, free_port, start_payonce
from tests.support.redis import running_redis
from tests.support.tls import make_certificates

APP = """
import openai

client = openai.OpenAI()  # OPENAI_BASE_URL: the gateway, set by payonce run
answer = client.chat.completions.with_raw_response.create(
    model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}]
)
print("key", answer.http_request.headers.get("Idempotency-Key"))
print("url", client.base_url)
"""


def test_payonce_run_points_the_app_at_the_gateway(gateway: Process, workspace: Workspace) -> None:
    (workspace.path / "app.py").write_text(APP)
    first, second = block("payonce-run").splitlines()
    # The first line as written, the gateway named by $PAYONCE_GATEWAY (its default
    # is the documented http://127.0.0.1:8080); the second with the fixture's gateway
    # for payonce.internal and this app for the gunicorn server nobody installed here.
    second = second.replace("http://payonce.internal:8080", gateway.url)
    second = second.replace("gunicorn app:server", "python app.py")
    for line in (first, second):
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=workspace.path,
            env=workspace.env(PAYONCE_GATEWAY=gateway.url),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"url {gateway.url}/v1/" in done.stdout, done.stdout
        key = done.stdout.split("key ", 1)[1].split()[0]
        assert key != "None", done.stdout


def test_the_port_in_use_message_is_the_one_the_page_shows(workspace: Workspace) -> None:
    text = block("sim-port-in-use")
    command, expected = text.split("\n", 1)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            ["bash", "-c", f"{command[2:]} --port {free_port()} --sim-port {port}"],
            cwd=workspace.path,
            env=workspace.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert loosely_in(expected.replace(":8100", f":{port}"), done.stderr), done.stderr


def test_the_tls_client_reaches_an_https_gateway(workspace: Workspace) -> None:
    certificates = make_certificates(workspace.path / "root")
    shutil.copy(certificates.ca, workspace.path / "ca.pem")
    process = start_payonce(
        [
            *("serve", "--upstream", "sim", "--sim-port", str(free_port())),
            *("--store", "memory://", "--tls-cert", str(certificates.cert)),
            *("--tls-key", str(certificates.key)),
        ],
        log_dir=workspace.path,
        ready_path="/_payonce/health",
        tls=certificates.client_context(),
    )
    try:
        code = block("tls-client").replace("https://gateway.internal:8443", process.url)
        code += 'print(client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]).id)\n'
        (workspace.path / "block.py").write_text(code)
        done = subprocess.run(
            [sys.executable, "block.py"],
            cwd=workspace.path,
            env=workspace.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        process.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip(), done.stderr


def test_a_block_reads_the_checkout(workspace: Workspace) -> None:
    assert Path(workspace.path / "deploy").resolve().is_dir()


# The project docs/lint-rules.md lints first: a tenacity layer over the SDK's own
# retries, a retrying nginx location, and 39 more files with nothing to report.
SUMMARISE = '''"""Summaries of support tickets, keyed once per ticket."""

from openai import OpenAI
from tenacity import retry, stop_after_attempt

MODEL = "gpt-4o-mini"
PROMPT = "Summarise this support ticket in two sentences."


def summarise(ticket_id, text):
    return _summarise(text, key=f"summarise-{ticket_id}")


# The SDK keeps its default retries (max_retries=2) under five tenacity
# attempts: one key per ticket, but up to fifteen generations.
client = OpenAI()


def messages(text):
    return [{"role": "system", "content": PROMPT}, {"role": "user", "content": text}]
@retry(stop=stop_after_attempt(5))
def _summarise(text, key):
    return client.chat.completions.create(
        model=MODEL, messages=messages(text), extra_headers={"Idempotency-Key": key}
    )
'''
NGINX = """events {}

http {
    upstream openai_pool {
        server api.openai.com:443;
        server api.openai.com:443 backup;
    }

    server {
        listen 8080;

        location /healthz {
            return 200;
        }

        location /v1/chat/completions {
            proxy_pass https://openai_pool;
            proxy_next_upstream error timeout non_idempotent;
            proxy_read_timeout 120s;
        }
    }
}
"""


def test_the_first_lint_example_is_what_payonce_lint_prints(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "deploy").mkdir()
    (tmp_path / "src" / "summarise.py").write_text(SUMMARISE)
    (tmp_path / "deploy" / "nginx.conf").write_text(NGINX)
    for number in range(39):
        (tmp_path / "src" / f"module_{number}.py").write_text(f"VALUE = {number}\n")
    run_console(
        block("lint-project"), Workspace(tmp_path, {"gateway": 0, "sim": 0, "prometheus": 0})
    )


def test_the_rediss_store_reaches_redis_over_tls(workspace: Workspace) -> None:
    certificates = make_certificates(workspace.path / "certificates")
    shutil.copy(certificates.ca, workspace.path / "root/etc/payonce/redis-ca.pem")
    with running_redis(workspace.path, tls=certificates) as redis:
        text = block("rediss-store").replace("redis.internal:6380", f"127.0.0.1:{redis.tls_port}")
        # Ready means the store answered: over TLS, trusting only the CA the page names.
        run_sh(text + "curl -sf http://127.0.0.1:8080/_payonce/health/ready\n", workspace)


def test_the_daily_reconcile_reads_rotated_logs_and_a_bill(workspace: Workspace) -> None:
    data.payonce_calls(workspace.path / "root/var/log/payonce")
    data.ledger_csv(workspace.path)
    done = run_sh(block("reconcile-daily"), workspace, check=False)
    summary = json.loads((workspace.path / "summary.json").read_text())
    assert (workspace.path / "report.html").read_text().lower().startswith("<!doctype html>")
    # --max-duplicate-ratio 0.02: the test bill's duplicates are above it, and the
    # command says so, with exit status 3 (an alert).
    assert summary["duplicate_ratio"] > 0.02
    assert done.returncode == 3, done.stderr
    assert "ALERT: duplicate_ratio" in done.stdout + done.stderr


def test_migrate_then_serve_without_migrating_on_postgresql(workspace: Workspace) -> None:
    with running_postgres() as server:
        text = block("postgres-migrate").replace("postgresql://payonce@db/payonce", server.url)
        # Ready means the store answered: the schema migrate made is the one serve expects.
        run_sh(text + "curl -sf http://127.0.0.1:8080/_payonce/health/ready\n", workspace)


@pytest.mark.parametrize("store", ["redis", "postgresql"])
def test_a_retry_on_another_replica_is_replayed(workspace: Workspace, store: str) -> None:
    """docs/howto-replicas.md: two gateways on one store, the retry sent to the other."""
    text = block("replicas").replace("8081", str(free_port()))
    with contextlib.ExitStack() as servers:
        if store == "redis":
            redis = servers.enter_context(running_redis(workspace.path))
            url = f"redis://127.0.0.1:{redis.port}/0"
        else:
            url = servers.enter_context(running_postgres()).url
        done = run_sh(text.replace("redis://127.0.0.1:6379/0", url), workspace)
    ledger = json.loads(done.stdout.strip().splitlines()[-1])
    assert ledger["billed"] == 1, ledger
