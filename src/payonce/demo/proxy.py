"""An anti-pattern, on purpose: a reverse proxy that re-sends a slow upstream request.

This is what nginx's ``proxy_next_upstream timeout`` (with ``proxy_read_timeout``),
Envoy's ``retry_on: ...`` with a per-try timeout, or a gateway's "retry slow
requests" setting do: when the upstream has not answered within ``--timeout``,
the proxy gives up on that request and sends it again, up to ``--retries``
times, then answers 504. Each abandoned request still runs to the end at an
LLM provider, and is billed. ``payonce demo`` runs it to show that, and to show
why payonce must be the last hop before the provider. It is never part of the
gateway; ``payonce lint`` flags such settings in nginx, Envoy and LiteLLM
configs.

Run alone: ``python -m payonce.demo.proxy --upstream URL --port N --timeout 0.8 --retries 1``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

__all__ = ["main", "make_app"]

# Hop-by-hop headers (RFC 9110 section 7.6.1) and those aiohttp sets itself.
_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-connection", "te", "trailer",
        "transfer-encoding", "upgrade", "host", "content-length",
    }
)  # fmt: skip
_SESSION = web.AppKey("session", aiohttp.ClientSession)


def make_app(upstream: str, timeout: float, retries: int) -> web.Application:
    """The proxy as an aiohttp application forwarding every path to ``upstream``."""

    async def forward(request: web.Request) -> web.StreamResponse:
        session = request.app[_SESSION]
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        url = upstream + request.rel_url.raw_path_qs
        for _ in range(retries + 1):
            try:
                async with session.request(
                    request.method,
                    url,
                    data=body,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(sock_read=timeout),
                ) as answer:
                    content = await answer.read()
                    kept = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
                    return web.Response(status=answer.status, body=content, headers=kept)
            except TimeoutError:
                continue  # the anti-pattern: send it again (the first one is still billed)
            except aiohttp.ClientError:
                return web.Response(status=502, text="upstream unavailable")
        return web.Response(status=504, text="upstream timed out")

    async def session(app: web.Application) -> AsyncIterator[None]:
        app[_SESSION] = aiohttp.ClientSession(auto_decompress=False)
        yield
        await app[_SESSION].close()

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


async def _serve(upstream: str, host: str, port: int, timeout: float, retries: int) -> None:
    # handler_cancellation: like nginx, a client that leaves stops its request here
    # (the upstream request is closed, and not re-sent).
    runner = web.AppRunner(
        make_app(upstream.rstrip("/"), timeout, retries),
        handler_cancellation=True,
        access_log=None,
    )
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    """Command line of the retrying proxy (used by ``payonce demo``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--timeout", type=float, required=True, help="seconds per try")
    parser.add_argument("--retries", type=int, default=1, help="re-sends after a timeout")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.upstream, args.host, args.port, args.timeout, args.retries))


if __name__ == "__main__":
    main()
