"""A tiny load balancer for tests: real TCP, fail-over between backends, and a request count.

Each client connection goes to the first backend that accepts a TCP connection
(a dead backend refuses it, so the next one gets the traffic, as a load
balancer's health check would arrange). Bytes are relayed both ways unchanged.
The proxy counts the HTTP requests it relays whose request line starts with a
given prefix, so a test can bound how often a client asked for something.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

__all__ = ["FailoverProxy", "running_proxy"]

_CHUNK = 65536


@dataclass
class FailoverProxy:
    """Listens on a free 127.0.0.1 port; relays each connection to the first live backend."""

    backends: Sequence[tuple[str, int]]
    counted_prefix: bytes
    port: int = 0
    _listener: socket.socket | None = None
    _count: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def count(self) -> int:
        """Requests relayed so far whose request line starts with ``counted_prefix``."""
        with self._lock:
            return self._count

    def start(self) -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closing.set()
        if self._listener is not None:
            self._listener.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _connect(self) -> socket.socket | None:
        for host, port in self.backends:
            try:
                return socket.create_connection((host, port), timeout=5)
            except OSError:
                continue
        return None

    def _serve(self, client: socket.socket) -> None:
        # The connection's first bytes are read and counted before a backend is
        # chosen: a backend dying as it accepts (a killed process's listener
        # still queues connections until its exit closes it) resets both sides,
        # and the request the client did send must still be counted.
        tail = b"\r\n"  # the stream's first request line starts right away
        try:
            first = client.recv(_CHUNK)
        except OSError:
            first = b""
        if not first:
            client.close()
            return
        tail = self._counted(tail, first)
        upstream = self._connect()
        if upstream is None:
            client.close()
            return
        upstream.settimeout(None)
        try:
            upstream.sendall(first)
        except OSError:
            for sock in (client, upstream):
                sock.close()
            return
        back = threading.Thread(target=self._pipe, args=(upstream, client, None), daemon=True)
        back.start()
        self._pipe(client, upstream, tail)
        back.join()

    def _counted(self, tail: bytes, data: bytes) -> bytes:
        """Count the request lines in ``data``; return the tail to keep for the next read.

        The tail of the previous chunk is kept so that a line split across reads still counts.
        """
        marker = b"\r\n" + self.counted_prefix
        seen = tail + data
        found = seen.count(marker)
        if found:
            with self._lock:
                self._count += found
        return seen[-(len(marker) - 1) :]

    def _pipe(self, source: socket.socket, target: socket.socket, tail: bytes | None) -> None:
        # ``tail`` is None for the backend's bytes, which are not counted.
        try:
            while data := source.recv(_CHUNK):
                if tail is not None:
                    tail = self._counted(tail, data)
                target.sendall(data)
        except OSError:
            pass
        finally:
            # Either side closing ends both: the client sees what a dead backend did.
            for sock in (source, target):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


@contextlib.contextmanager
def running_proxy(urls: Sequence[str], counted_prefix: bytes) -> Iterator[FailoverProxy]:
    """A :class:`FailoverProxy` in front of ``urls`` (``http://host:port``), in that order."""
    backends = []
    for url in urls:
        host, _, port = url.removeprefix("http://").partition(":")
        backends.append((host, int(port)))
    proxy = FailoverProxy(backends, counted_prefix)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.close()
