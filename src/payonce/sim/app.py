"""The simulated provider as an ``aiohttp.web.Application``: routes and the ledger's lifecycle.

========================== ===========================================================
route                      answer
========================== ===========================================================
POST /v1/chat/completions  OpenAI chat completion (``"stream": true``: its chunks)
POST /v1/completions       OpenAI legacy text completion (or its chunks)
POST /v1/embeddings        OpenAI embeddings
POST /v1/responses         OpenAI Responses API response (``"stream": true``: its events;
                           ``"background": true``: queued, generated afterwards)
GET  /v1/responses/{id}    a stored response (:mod:`~payonce.sim.response_store`), in its
                           latest state; 404 when not stored or another project's
POST /v1/messages          Anthropic message (``"stream": true``: its events)
GET  /v1/models            the priced models (Anthropic's list shape when the request
                           has an ``anthropic-version`` header)
GET  /_sim/health          ``{"status": "ok"}``
GET  /_sim/ledger          ``{"billed", "cost_usd", "requests", "generating", "entries"}``;
                           ``?entries=0`` leaves the entries out
DELETE /_sim/ledger        reset the in-memory ledger (the CSV export keeps its rows)
GET  /v1/organization/usage/completions, /v1/organization/costs,
     /v1/organizations/usage_report/messages, /v1/organizations/cost_report
                           the providers' admin usage and cost reports, from the
                           ledger (:mod:`~payonce.sim.admin`; an admin-looking key)
anything else              404 in the provider's JSON error shape
========================== ===========================================================
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from aiohttp import web

from payonce.clock import Clock, SystemClock
from payonce.sim.admin import ADMIN_ROUTES, report_handler
from payonce.sim.bodies import model_list
from payonce.sim.config import SimConfig
from payonce.sim.ledger import CsvExport, Ledger, credential_ids, credential_of
from payonce.sim.provider import ENDPOINTS, Endpoint, Simulator
from payonce.sim.provider_errors import Api, error_body

__all__ = ["CSV_FLUSH_SECONDS", "LEDGER", "SIMULATOR", "build_app"]

LEDGER = web.AppKey("payonce.sim.ledger", Ledger)
SIMULATOR = web.AppKey("payonce.sim.simulator", Simulator)

# How often buffered CSV rows reach the file, so `tail -f` shows them without a
# flush per request on the benchmark path.
CSV_FLUSH_SECONDS = 1.0
# Prompts with images or long documents are larger than aiohttp's 1 MiB default.
_MAX_BODY_BYTES = 32 * 1024 * 1024

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_app(config: SimConfig, *, clock: Clock | None = None) -> web.Application:
    """The simulated provider for ``config``. ``clock`` stamps ``created`` and ``finished_at``.

    The CSV export (``config.ledger_path``) is opened when the application starts and
    closed, flushed, when it shuts down.
    """
    app = web.Application(client_max_size=_MAX_BODY_BYTES)
    ledger = Ledger()
    simulator = Simulator(config, clock or SystemClock(), ledger)
    app[LEDGER] = ledger
    app[SIMULATOR] = simulator

    for endpoint in ENDPOINTS:
        app.router.add_post(endpoint.path, _generation_handler(simulator, endpoint))
    app.router.add_get("/v1/responses/{response_id}", _retrieve_handler(simulator))
    app.router.add_get("/v1/models", _models)
    for report in ADMIN_ROUTES:
        app.router.add_get(report.path, report_handler(report, _ledger_of, simulator.clock.now))
    app.router.add_get("/_sim/health", _health)
    app.router.add_get("/_sim/ledger", _read_ledger)
    app.router.add_delete("/_sim/ledger", _reset_ledger)
    # Last, so it only catches what nothing above matched (also a wrong method).
    app.router.add_route("*", "/{tail:.*}", _not_found)

    if config.ledger_path is not None:
        app.cleanup_ctx.append(_csv_export(config.ledger_path))
    app.on_cleanup.append(lambda _app: simulator.close())
    return app


def _generation_handler(simulator: Simulator, endpoint: Endpoint) -> _Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await simulator.generate(request, endpoint)

    return handle


def _retrieve_handler(simulator: Simulator) -> _Handler:
    """``GET /v1/responses/{id}``: never refused, delayed or counted as a generation request."""

    async def retrieve(request: web.Request) -> web.Response:
        response_id = request.match_info["response_id"]
        if request.query.get("stream", "").lower() in ("1", "true"):
            message = "Streaming a stored response (stream=true) is not modelled by payonce sim."
            return _openai_error(400, message, param="stream")
        project = credential_ids(credential_of(request.headers), anthropic=False)[1]
        body = simulator.responses.get(response_id, project)
        if body is None:
            return _openai_error(404, f"Response with id '{response_id}' not found.")
        response = web.Response(body=body, content_type="application/json")
        response.headers["x-request-id"] = simulator.new_request_id("req_")
        return response

    return retrieve


def _openai_error(status: int, message: str, *, param: str | None = None) -> web.Response:
    return web.Response(
        body=error_body(Api.OPENAI, status, message, param=param),
        status=status,
        content_type="application/json",
    )


def _ledger_of(request: web.Request) -> Ledger:
    return request.app[LEDGER]


async def _models(request: web.Request) -> web.Response:
    anthropic = "anthropic-version" in request.headers
    return web.Response(body=model_list(anthropic), content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _read_ledger(request: web.Request) -> web.Response:
    ledger = request.app[LEDGER]
    if ledger.export is not None:
        # Whoever reads the ledger over HTTP may read the CSV next; make them agree.
        ledger.export.flush()
    with_entries = request.query.get("entries", "1").lower() not in ("0", "false", "no")
    return web.json_response(ledger.summary(with_entries=with_entries))


async def _reset_ledger(request: web.Request) -> web.Response:
    ledger = request.app[LEDGER]
    ledger.reset()
    return web.json_response(ledger.summary())


async def _not_found(request: web.Request) -> web.Response:
    anthropic = request.path.startswith(("/v1/messages", "/v1/organizations/"))
    api = Api.ANTHROPIC if anthropic else Api.OPENAI
    # OpenAI's own wording for an unknown route.
    message = f"Invalid URL ({request.method} {request.path})"
    return web.Response(
        body=error_body(api, 404, message), status=404, content_type="application/json"
    )


def _csv_export(path: Path) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        ledger = app[LEDGER]
        export = CsvExport(path)
        ledger.export = export
        flusher = asyncio.create_task(_flush_every(export, CSV_FLUSH_SECONDS))
        try:
            yield
        finally:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
            ledger.export = None
            export.close()

    return lifecycle


async def _flush_every(export: CsvExport, seconds: float) -> None:
    while True:
        await asyncio.sleep(seconds)
        export.flush()
