"""``redis://`` and ``redis+cluster://``: records shared by every gateway replica.

Each state change is one Lua script run with ``EVALSHA`` (:mod:`.scripts`), so
one round trip and atomic; reads are one ``HGETALL`` or one script. Commands
issued in the same event-loop turn share a pipeline (:mod:`.batch`). Keys of a
record share a hash tag (:mod:`.keys`), so Redis Cluster works as well as a
single server. Waiting uses per-record Pub/Sub (:mod:`.notify`).

Time comes from the injected clock, passed to every script: leases and TTLs
follow the gateway's clock (the tests' ``ManualClock``), never the server's.
Redis's own expiry only collects garbage: a claim and each renewal set ``PEXPIRE``
to the record's expiry plus ``expiry_margin`` (60 s by default, for clock
differences between replicas), never shorter than it was, and a completion to
the ttl plus the margin, so :meth:`RedisStore.purge_expired` has nothing to do.

Errors are translated once, here: a timeout becomes
:class:`~payonce.errors.StorageTimeout`, anything else Redis raises
(connection refused or reset, cluster down, out of memory)
:class:`~payonce.errors.StorageError`, with redis-py's message (which names the
server: for the operator's log, never for callers). A command that fails on a broken
pooled connection (the server restarted) is retried once at once on a fresh
connection; a server that stays down fails the operation within ``timeout``,
and the store works again as soon as it is back, without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import urllib.parse
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import Any, cast

import orjson
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from payonce.clock import Clock, SystemClock
from payonce.errors import StorageError, StorageTimeout
from payonce.store.base import (
    Appended,
    Claim,
    ClaimStatus,
    Record,
    RecordState,
    StoredResponse,
    held_expiry,
    new_token,
)
from payonce.store.redis import scripts
from payonce.store.redis.batch import Batcher
from payonce.store.redis.keys import RecordKeys, record_keys
from payonce.store.redis.notify import Notifications
from payonce.store.redis.url import parse_redis_url
from payonce.store.sealing import PLAIN, Codec

__all__ = ["RedisStore"]

_STATUSES = {
    b"completed": ClaimStatus.COMPLETED,
    b"in_progress": ClaimStatus.IN_PROGRESS,
    b"mismatch": ClaimStatus.MISMATCH,
}


def _translate(exc: BaseException) -> StorageError:
    if isinstance(exc, RedisTimeoutError | TimeoutError):
        return StorageTimeout(f"Redis store timed out: {exc}")
    return StorageError(f"Redis store failed: {exc}")


_FAILURES = (RedisError, RedisClusterException, OSError)


def _optional_float(value: bytes | None) -> float | None:
    return float(value) if value is not None else None


def _expired(fields: Mapping[bytes, bytes], now: float) -> bool:
    """:meth:`Record.expired` from the raw fields, before anything is decoded."""
    if float(fields[b"expires_at"]) > now:
        return False
    running = fields[b"state"] == b"in_progress"
    return not (running and float(fields[b"lease_expires_at"]) > now)


def _record(tenant: str, key: str, fields: Mapping[bytes, bytes], codec: Codec) -> Record:
    response = None
    status = fields.get(b"status")
    if status is not None:
        stream = fields.get(b"stream") == b"1"
        body = fields.get(b"body", b"")
        response = codec.response_in(tenant, key, int(status), fields[b"headers"], body, stream)
    usage = fields.get(b"usage")
    return Record(
        tenant=tenant,
        key=key,
        fingerprint=fields[b"fingerprint"].decode(),
        state=RecordState(fields[b"state"].decode()),
        token=fields[b"token"].decode(),
        created_at=float(fields[b"created_at"]),
        lease_expires_at=float(fields[b"lease_expires_at"]),
        expires_at=float(fields[b"expires_at"]),
        completed_at=_optional_float(fields.get(b"completed_at")),
        response=response,
        replays=int(fields.get(b"replays", 0)),
        usage=orjson.loads(usage) if usage is not None else None,
        cost_usd=_optional_float(fields.get(b"cost_usd")),
        events=int(fields.get(b"events", 0)),
    )


class RedisStore:
    """The :class:`payonce.store.base.Store` protocol on Redis or Redis Cluster.

    ``url`` is a ``--store`` URL (:mod:`payonce.store.redis.url`). ``poll_interval``
    bounds how late :meth:`wait` notices a change whose message was lost;
    ``expiry_margin`` is how long Redis keeps a record's keys past its ttl.
    ``auto_pipeline`` sends the commands of one event-loop turn as one pipeline
    (:mod:`.batch`). ``codec`` gives the stored form of responses and events
    (:mod:`payonce.store.sealing`). Nothing connects until the first operation.
    """

    def __init__(
        self,
        url: str,
        clock: Clock | None = None,
        *,
        poll_interval: float = 1.0,
        expiry_margin: float = 60.0,
        auto_pipeline: bool = True,
        codec: Codec = PLAIN,
    ) -> None:
        config = parse_redis_url(url)
        self._codec = codec
        self._clock = clock or SystemClock()
        self._prefix = config.prefix
        self._poll_interval = poll_interval
        self._timeout = config.timeout
        # For the operator's log line: host and port, never the credentials.
        self._where = urllib.parse.urlsplit(config.url).netloc.rpartition("@")[2]
        self._margin_ms = int(expiry_margin * 1000)
        # One immediate retry, on a new connection, for connection errors only:
        # it hides pooled connections that a server restart broke, and adds no
        # wait when the server is really down. Timeouts are not retried.
        retry = Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
        # redis-py 8's pools (a server's, and each cluster node's) allow 100
        # connections and then fail the command ("Too many connections"): each
        # event-loop turn's pipeline holds one until Redis answers, so thousands of
        # calls in flight against a Redis slow for a moment got 503s. Redis's own
        # default maxclients is 10,000.
        options: dict[str, Any] = {
            "socket_timeout": config.timeout,
            "socket_connect_timeout": config.timeout,
            "retry": retry,
            "max_connections": 10_000,
        }
        self._client: Redis | RedisCluster
        if config.cluster:
            self._client = RedisCluster.from_url(config.url, **options)
            self._publish = b"SPUBLISH"
        else:
            self._client = Redis.from_url(config.url, **options)
            self._publish = b"PUBLISH"
        self._notifications = Notifications(self._client, ready_timeout=poll_interval)
        self._batch = Batcher(self._client) if auto_pipeline else None
        self._initialized = False
        self._initializing = asyncio.Lock()

    async def _initialize(self) -> None:
        # redis-py 8.1's cluster client, asked for many commands at once before
        # it knows the cluster's layout, may hand one connection to two of them
        # (reset mid-command): learn the layout first, once, alone.
        async with self._initializing:
            if not self._initialized:
                async with self._guarded():
                    await self._client.initialize()
                self._initialized = True

    @contextlib.asynccontextmanager
    async def _guarded(self) -> AsyncIterator[None]:
        """Fail within ``timeout`` as one of the store's errors, whatever Redis raised.

        ``socket_timeout`` bounds one read, not an operation: redis-py's cluster
        client retries a command (and a pipeline) that timed out on a node, so a
        frozen node took twice ``timeout`` to fail (issue 29). A standalone server's
        client does not retry timeouts, and this bound changes nothing there.
        """
        try:
            async with asyncio.timeout(self._timeout):
                yield
        except TimeoutError as exc:  # the bound above (or a connect that timed out)
            raise StorageTimeout(
                f"Redis store at {self._where} did not answer within {self._timeout:g} s"
            ) from exc
        except _FAILURES as exc:
            raise _translate(exc) from exc

    def keys(self, tenant: str, key: str) -> RecordKeys:
        """The Redis names of a record (for operators and tests)."""
        return record_keys(self._prefix, tenant, key)

    async def _run(
        self, script: scripts.Script, keys: RecordKeys, *args: Any, deferred: bool = False
    ) -> Any:
        """Run ``script``; ``deferred``: it may wait ``group_commit.DEFER`` for company."""
        names = (keys.record, keys.events)
        if not self._initialized:
            await self._initialize()
        async with self._guarded():
            if self._batch is None:
                try:
                    return await self._client.evalsha(script.sha, 2, *names, *args)
                except NoScriptError:  # a server that restarted forgot it: EVAL caches it again
                    return await self._client.eval(script.source, 2, *names, *args)
            evalsha = ("EVALSHA", script.sha, 2, *names, *args)
            run = self._batch.execute_later if deferred else self._batch.execute
            return await run(*evalsha, noscript=("EVAL", script.source, *evalsha[2:]))

    async def claim(
        self, tenant: str, key: str, fingerprint: str, *, lease: float, ttl: float
    ) -> Claim:
        now = self._clock.now()
        token = new_token()
        lease_end = now + lease
        expires_at = held_expiry(lease_end, lease, now + ttl)
        keys = self.keys(tenant, key)
        gc_ms = self._gc_ms(expires_at - now)
        reply = await self._run(
            scripts.CLAIM,
            keys,
            fingerprint,
            token,
            repr(now),
            repr(lease_end),
            repr(expires_at),
            gc_ms,
        )
        if reply[0] == b"acquired":
            record = Record(
                tenant=tenant,
                key=key,
                fingerprint=fingerprint,
                state=RecordState.IN_PROGRESS,
                token=token,
                created_at=now,
                lease_expires_at=lease_end,
                expires_at=expires_at,
            )
            return Claim(ClaimStatus.ACQUIRED, record)
        fields = dict(zip(reply[1::2], reply[2::2], strict=True))
        return Claim(_STATUSES[reply[0]], _record(tenant, key, fields, self._codec))

    def _gc_ms(self, seconds: float) -> int:
        """Milliseconds until Redis may delete keys whose record expires in ``seconds``."""
        return math.ceil(seconds * 1000) + self._margin_ms

    async def renew(self, tenant: str, key: str, token: str, *, lease: float) -> bool:
        now = self._clock.now()
        lease_end = now + lease
        expires_at = held_expiry(lease_end, lease)
        keys = self.keys(tenant, key)
        renewed = await self._run(
            scripts.RENEW,
            keys,
            token,
            repr(now),
            repr(lease_end),
            repr(expires_at),
            self._gc_ms(expires_at - now),
        )
        return bool(renewed)

    async def complete(
        self,
        tenant: str,
        key: str,
        token: str,
        response: StoredResponse,
        *,
        usage: Mapping[str, int] | None = None,
        cost_usd: float | None = None,
        replays: int = 0,
        ttl: float,
    ) -> bool:
        keys = self.keys(tenant, key)
        now = self._clock.now()
        done = await self._run(
            scripts.COMPLETE,
            keys,
            token,
            repr(now),
            keys.channel,
            self._publish,
            response.status,
            *self._codec.response_out(tenant, key, response),
            b"1" if response.stream else b"0",
            replays,
            orjson.dumps(dict(usage)) if usage is not None else b"",
            repr(cost_usd) if cost_usd is not None else b"",
            repr(now + ttl),
            self._gc_ms(ttl),
        )
        return bool(done)

    async def release(self, tenant: str, key: str, token: str) -> bool:
        keys = self.keys(tenant, key)
        now = repr(self._clock.now())
        return bool(await self._run(scripts.RELEASE, keys, token, now, keys.channel, self._publish))

    async def begin_stream(
        self, tenant: str, key: str, token: str, status: int, headers: tuple[tuple[str, str], ...]
    ) -> bool:
        keys = self.keys(tenant, key)
        now = repr(self._clock.now())
        started = await self._run(
            scripts.BEGIN_STREAM,
            keys,
            token,
            now,
            status,
            self._codec.headers_out(tenant, key, headers),
        )
        return bool(started)

    async def append_events(
        self, tenant: str, key: str, token: str, first: int, events: Sequence[bytes]
    ) -> Appended:
        keys = self.keys(tenant, key)
        now = repr(self._clock.now())
        stored = self._codec.events_out(tenant, key, first, events)
        added = await self._run(
            scripts.APPEND_EVENTS,
            keys,
            token,
            now,
            keys.channel,
            self._publish,
            first,
            *stored,
            deferred=True,  # followers here got the events live; this is for the rest
        )
        return Appended(int(added))  # 2: the notification had receivers (scripts.py)

    async def watched_runs(self, runs: Collection[tuple[str, str]]) -> set[tuple[str, str]]:
        # What an append learns from its PUBLISH's receivers (scripts.py), asked
        # of the channels' subscriber counts; on a cluster, of every node (a
        # sharded channel's subscribers are on its shard's), redis-py adding up.
        if not runs:
            return set()
        channels = {self.keys(tenant, key).channel: (tenant, key) for tenant, key in runs}
        async with self._guarded():
            if self._publish == b"SPUBLISH":
                counts = await self._client.pubsub_shardnumsub(
                    *channels, target_nodes=RedisCluster.ALL_NODES
                )
            else:
                counts = await self._client.pubsub_numsub(*channels)
        return {
            channels[channel if isinstance(channel, bytes) else channel.encode()]
            for channel, count in counts
            if count > 0
        }

    async def read_events(self, tenant: str, key: str, after: int = 0) -> list[bytes]:
        keys = self.keys(tenant, key)
        events = await self._run(scripts.READ_EVENTS, keys, repr(self._clock.now()), after)
        return self._codec.events_in(tenant, key, after, list(events))

    async def add_replays(self, counts: Mapping[tuple[str, str], int], *, batch: str = "") -> None:
        if not counts:
            return
        now = repr(self._clock.now())
        calls = [(self.keys(tenant, key), count) for (tenant, key), count in counts.items()]
        script = scripts.ADD_REPLAYS
        if not self._initialized:
            await self._initialize()
        async with self._guarded():
            # One pipeline, one round trip (per shard on a cluster).
            pipe = self._client.pipeline(transaction=False)
            for keys, count in calls:
                # The batch's mark shares the record's hash tag, so its slot.
                # execute_command: ClusterPipeline blocks its evalsha() method
                # only because keys must share a slot, which ours always do.
                mark = keys.record + b":b:" + batch.encode()
                pipe.execute_command(
                    "EVALSHA", script.sha, 3, keys.record, keys.events, mark, now, count, batch
                )
            results = await pipe.execute(raise_on_error=False)
            for (keys, count), result in zip(calls, results, strict=True):
                if isinstance(result, NoScriptError):
                    mark = keys.record + b":b:" + batch.encode()
                    await self._client.eval(
                        script.source, 3, keys.record, keys.events, mark, now, count, batch
                    )
                elif isinstance(result, Exception):
                    raise result

    async def get(self, tenant: str, key: str) -> Record | None:
        if not self._initialized:
            await self._initialize()
        async with self._guarded():
            # bytes -> bytes, as the client does not decode responses
            name = self.keys(tenant, key).record
            if self._batch is None:
                found = await self._client.hgetall(name)
            else:
                found = await self._batch.execute("HGETALL", name)
            fields = cast("dict[bytes, bytes]", found)
        if not fields or _expired(fields, self._clock.now()):
            return None
        return _record(tenant, key, fields, self._codec)

    async def wait(self, tenant: str, key: str, timeout: float) -> Record | None:
        # Subscribe first, then read: a change after the read always wakes us.
        # ``changed`` is taken before each read, so a message that arrives while
        # the read is in flight is not lost either.
        if timeout <= 0:
            return await self.get(tenant, key)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        first: Record | None = None
        try:
            async with self._notifications.watch(self.keys(tenant, key).channel) as watch:
                while True:
                    changed = watch.changed
                    record = await self.get(tenant, key)
                    if record is None or record.state is RecordState.COMPLETED:
                        return record
                    if first is None:
                        first = record
                    elif record.events != first.events or record.token != first.token:
                        return record
                    now = self._clock.now()
                    remaining = deadline - loop.time()
                    if record.lease_lapsed(now) or remaining <= 0:
                        return record
                    until_lease_end = record.lease_expires_at - now
                    pause = min(remaining, until_lease_end, self._poll_interval)
                    await watch.sleep(changed, pause)
        except StorageError:
            raise
        except _FAILURES as exc:
            raise _translate(exc) from exc

    async def purge_expired(self, limit: int | None = None) -> int:
        """Nothing to do: Redis deletes a record's keys itself, ``expiry_margin`` after its ttl.

        Until then reads treat the record as gone (its ``expires_at`` has
        passed by the gateway's clock). Returns 0.
        """
        return 0

    async def ping(self) -> None:
        if not self._initialized:
            await self._initialize()
        async with self._guarded():
            if isinstance(self._client, RedisCluster):
                # Every primary: one that does not answer holds a share of the keys.
                await self._client.ping(target_nodes=RedisCluster.PRIMARIES)
            else:
                await self._client.ping()

    async def close(self) -> None:
        if self._batch is not None:
            await self._batch.close()
        await self._notifications.close()
        await self._client.aclose()
