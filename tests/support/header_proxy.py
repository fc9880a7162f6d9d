"""A reverse proxy for tests that drops some response headers, and changes nothing else.

It makes one real server look like another that lacks a header: llama-cpp-python's
server sends ``x-request-id``, llama.cpp's own ``llama-server`` (and many
self-hosted servers) do not. Requests go through unchanged (hop-by-hop headers
aside); response bodies, streams included, are relayed chunk by chunk as they
arrive. It never retries: a request is sent upstream once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import aiohttp
from aiohttp import web

from tests.support.processes import free_port

__all__ = ["dropping_headers"]

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}
)


@contextlib.contextmanager
def dropping_headers(upstream: str, names: tuple[str, ...]) -> Iterator[str]:
    """The URL of a proxy to ``upstream`` whose responses lack the headers ``names``."""
    dropped = {name.lower() for name in names} | _HOP_BY_HOP
    loop = asyncio.new_event_loop()
    port = free_port()
    started = threading.Event()
    state: dict[str, object] = {}

    async def relay(request: web.Request) -> web.StreamResponse:
        session = state["session"]
        assert isinstance(session, aiohttp.ClientSession)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with session.request(
            request.method,
            upstream + request.path_qs,
            headers=headers,
            data=await request.read(),
            allow_redirects=False,
            auto_decompress=False,
        ) as answer:
            response = web.StreamResponse(status=answer.status)
            for name, value in answer.headers.items():
                if name.lower() not in dropped:
                    response.headers.add(name, value)
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def serve() -> None:
        state["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", relay)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        state["runner"] = runner
        started.set()

    async def stop() -> None:
        runner = state["runner"]
        assert isinstance(runner, web.AppRunner)
        await runner.cleanup()
        session = state["session"]
        assert isinstance(session, aiohttp.ClientSession)
        await session.close()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(serve(), loop).result(10)
    started.wait(10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
