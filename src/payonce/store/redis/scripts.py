"""The Lua scripts of the Redis store: every state change is one of these, hence atomic.

The scripts take (at most) the same two keys, both in one hash slot (see
:mod:`payonce.store.redis.keys`)::

    KEYS[1] - the record: a hash (fields below)
    KEYS[2] - the record's streamed events: a list, event n at index n - 1

and the fenced ones (renew, complete, release, begin_stream, append_events)
start their arguments alike::

    ARGV[1] - the writer's fencing token
    ARGV[2] - now, from the gateway's clock (seconds since the epoch, a float)

A fenced script writes only while the record is *held* by that token: it
exists, its ``token`` field is ``ARGV[1]``, its ``state`` is ``in_progress`` and
its ``expires_at`` is after ``now``. It returns 1 when it wrote, 0 when it did
not (the caller's lease was lost). The lease itself (``lease_expires_at``) is
not checked: a holder whose lease ran out may still finish as long as nobody
took the key over, as in the other stores. (A live lease always has its
``expires_at`` at least a lease past its end: claims and renewals put it there.)

A record is *live* while its ``expires_at`` is after ``now`` or, in progress,
its lease is (:meth:`payonce.store.base.Record.expired`): a record an earlier
version wrote may have a live lease past its expiry, and its call is running.

Redis's own expiry (``PEXPIRE``, garbage collection only) follows the record's:
a claim and every renewal set it to at least ``expires_at`` plus the store's
margin, never shorter than it was; a completion resets it to ttl plus the margin.

Time never comes from the Redis server: scripts compare the ``now`` they are
given with times the gateway wrote, so an injected clock (the test suite's
``ManualClock``) drives lease expiry and TTL, and replicas agree on time as well
as their clocks do. Times are stored as the caller formats them (Python's
``repr`` of a float round-trips exactly); Lua only compares them.

Record hash fields: ``fingerprint``, ``state`` (``in_progress`` or
``completed``), ``token``, ``created_at``, ``lease_expires_at``, ``expires_at``,
``completed_at``, ``status``, ``headers`` (JSON pairs), ``body``, ``stream``
(``1`` for a streamed response), ``events`` (how many are recorded),
``replays``, ``usage`` (JSON), ``cost_usd``. Absent optional fields are absent.

Notifications: complete, release and append_events publish to the record's
channel (``ARGV[3]``) with the command in ``ARGV[4]``: ``PUBLISH`` on a single
server, ``SPUBLISH`` (sharded Pub/Sub, Redis 7) on a cluster, where the channel
carries the record's hash tag so the message stays on the record's shard.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = [
    "ADD_REPLAYS",
    "APPEND_EVENTS",
    "BEGIN_STREAM",
    "CLAIM",
    "COMPLETE",
    "READ_EVENTS",
    "RELEASE",
    "RENEW",
    "Script",
]


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script and its SHA1, run with ``EVALSHA`` (``EVAL`` once per server to cache it)."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())  # noqa: S324


_HELD = """
local function held()
    local record = redis.call('HMGET', KEYS[1], 'token', 'state', 'expires_at')
    return record[1] == ARGV[1] and record[2] == 'in_progress'
        and tonumber(record[3]) > tonumber(ARGV[2])
end
"""

# KEYS[1] - record, KEYS[2] - events
# ARGV[1] - fingerprint
# ARGV[2] - token for a new holder (random, minted by the caller)
# ARGV[3] - now
# ARGV[4] - lease_expires_at for a new holder
# ARGV[5] - expires_at for a new holder (store.base.held_expiry)
# ARGV[6] - milliseconds until Redis deletes the keys (until expires_at, plus a margin)
# Returns {'acquired'} when the caller now holds the key (new, past its ttl, or
# lease ran out with the same fingerprint), else {status, field, value, ...}:
# 'mismatch', 'completed' or 'in_progress' followed by the record (HGETALL).
# A claim retried after a lost reply finds its own token and is 'acquired'.
# Why not SET NX PX: a claim must also take over a lapsed lease (same
# fingerprint only), treat a record past its ttl by the caller's clock as
# absent, and answer a duplicate with the record it found. With SET NX every
# duplicate would need a second round trip to read the record, and take-over a
# third step that is not atomic with the first.
CLAIM = Script(
    "claim",
    """
local now = tonumber(ARGV[3])
local found = redis.call('HMGET', KEYS[1], 'fingerprint', 'state', 'lease_expires_at',
    'expires_at', 'token')
local live = found[1] and (tonumber(found[4]) > now
    or (found[2] == 'in_progress' and tonumber(found[3]) > now))
if live then
    if found[5] == ARGV[2] then
        return {'acquired'}
    end
    local status
    if found[1] ~= ARGV[1] then
        status = 'mismatch'
    elseif found[2] == 'completed' then
        status = 'completed'
    elseif tonumber(found[3]) > now then
        status = 'in_progress'
    end
    if status then
        local reply = redis.call('HGETALL', KEYS[1])
        table.insert(reply, 1, status)
        return reply
    end
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[1], 'fingerprint', ARGV[1], 'state', 'in_progress', 'token', ARGV[2],
    'created_at', ARGV[3], 'lease_expires_at', ARGV[4], 'expires_at', ARGV[5],
    'replays', 0, 'events', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {'acquired'}
""",
)

# KEYS[1] - record, KEYS[2] - events
# ARGV[1] - token, ARGV[2] - now
# ARGV[3] - the new lease_expires_at
# ARGV[4] - the earliest expires_at the record may have now (store.base.held_expiry)
# ARGV[5] - milliseconds until Redis may delete the keys (until ARGV[4], plus a margin)
# Returns 1 when renewed, 0 when not held. Neither expiry is ever moved earlier:
# a call that runs past its ttl keeps its keys as long as it is renewed.
RENEW = Script(
    "renew",
    _HELD
    + """
if not held() then return 0 end
redis.call('HSET', KEYS[1], 'lease_expires_at', ARGV[3])
if tonumber(redis.call('HGET', KEYS[1], 'expires_at')) < tonumber(ARGV[4]) then
    redis.call('HSET', KEYS[1], 'expires_at', ARGV[4])
end
local gc = tonumber(ARGV[5])
for _, name in ipairs(KEYS) do
    local pttl = redis.call('PTTL', name)
    if pttl ~= -2 and pttl < gc then redis.call('PEXPIRE', name, gc) end
end
return 1
""",
)

# KEYS[1] - record, KEYS[2] - events
# ARGV[1] - token, ARGV[2] - now
# ARGV[3] - notification channel, ARGV[4] - 'PUBLISH' or 'SPUBLISH'
# ARGV[5] - status, ARGV[6] - headers (JSON), ARGV[7] - body
# ARGV[8] - '1' for a streamed response (its events are counted), else '0'
# ARGV[9] - replays to add (duplicates already answered)
# ARGV[10] - usage (JSON) or '', ARGV[11] - cost_usd or ''
# ARGV[12] - expires_at (now + ttl), ARGV[13] - milliseconds until Redis deletes
# the keys (ttl plus a margin)
# Returns 1 when stored (and publishes 'completed'), 0 when not held.
# The expiry is reset: an answer is replayed for ttl after it was stored.
COMPLETE = Script(
    "complete",
    _HELD
    + """
if not held() then return 0 end
local events = 0
if ARGV[8] == '1' then events = redis.call('LLEN', KEYS[2]) end
redis.call('HSET', KEYS[1], 'state', 'completed', 'completed_at', ARGV[2], 'status', ARGV[5],
    'headers', ARGV[6], 'body', ARGV[7], 'stream', ARGV[8], 'events', events,
    'expires_at', ARGV[12])
redis.call('PEXPIRE', KEYS[1], ARGV[13])
if events > 0 then redis.call('PEXPIRE', KEYS[2], ARGV[13]) end
redis.call('HINCRBY', KEYS[1], 'replays', ARGV[9])
if ARGV[10] ~= '' then redis.call('HSET', KEYS[1], 'usage', ARGV[10])
else redis.call('HDEL', KEYS[1], 'usage') end
if ARGV[11] ~= '' then redis.call('HSET', KEYS[1], 'cost_usd', ARGV[11])
else redis.call('HDEL', KEYS[1], 'cost_usd') end
redis.call(ARGV[4], ARGV[3], 'completed')
return 1
""",
)

# KEYS[1] - record, KEYS[2] - events
# ARGV[1] - token, ARGV[2] - now
# ARGV[3] - notification channel, ARGV[4] - 'PUBLISH' or 'SPUBLISH'
# Returns 1 when the record and its events are deleted (and publishes
# 'released'), 0 when not held.
RELEASE = Script(
    "release",
    _HELD
    + """
if not held() then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call(ARGV[4], ARGV[3], 'released')
return 1
""",
)

# KEYS[1] - record, KEYS[2] - events
# ARGV[1] - token, ARGV[2] - now
# ARGV[3] - status, ARGV[4] - headers (JSON)
# Returns 1 when the stream's head is recorded and any events a previous
# holder left are dropped, 0 when not held.
BEGIN_STREAM = Script(
    "begin_stream",
    _HELD
    + """
if not held() then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[3], 'headers', ARGV[4], 'body', '', 'stream', 1,
    'events', 0)
redis.call('DEL', KEYS[2])
return 1
""",
)

# KEYS[1] - record, KEYS[2] - events
# ARGV[1] - token, ARGV[2] - now
# ARGV[3] - notification channel, ARGV[4] - 'PUBLISH' or 'SPUBLISH'
# ARGV[5] - number of the first event (from 1); events from it on are replaced
# ARGV[6], ARGV[7], ... - the events
# Returns 1 when recorded (and publishes 'events'), 0 when not held, 2 when
# recorded and the notification had receivers: a follower somewhere waits on the
# record (store.Appended.WATCHED; the writer then writes more often). The list
# expires with its record (same PTTL).
APPEND_EVENTS = Script(
    "append_events",
    _HELD
    + """
if not held() then return 0 end
local first = tonumber(ARGV[5])
if first <= 1 then
    redis.call('DEL', KEYS[2])
else
    redis.call('LTRIM', KEYS[2], 0, first - 2)
end
-- unpack() in slices: Lua's stack holds a few thousand values at most.
for start = 6, #ARGV, 1000 do
    redis.call('RPUSH', KEYS[2], unpack(ARGV, start, math.min(start + 999, #ARGV)))
end
redis.call('HSET', KEYS[1], 'events', redis.call('LLEN', KEYS[2]))
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
if redis.call(ARGV[4], ARGV[3], 'events') > 0 then return 2 end
return 1
""",
)

# KEYS[1] - record, KEYS[2] - events
# ARGV[1] - now
# ARGV[2] - how many events to skip (the caller has them)
# Returns the events after ARGV[2], or {} when the record is gone or not live.
READ_EVENTS = Script(
    "read_events",
    """
local now = tonumber(ARGV[1])
local record = redis.call('HMGET', KEYS[1], 'expires_at', 'state', 'lease_expires_at')
if not record[1] then return {} end
if tonumber(record[1]) <= now
    and not (record[2] == 'in_progress' and tonumber(record[3]) > now) then return {} end
return redis.call('LRANGE', KEYS[2], ARGV[2], -1)
""",
)

# KEYS[1] - record
# ARGV[1] - now
# ARGV[2] - replays to add
# Adds to a completed, live record; does nothing to others (gone, past ttl,
# in progress). KEYS[3] marks the batch ARGV[3] as added to this record (an
# hour): the same batch again, after a timeout that hid its success, adds
# nothing. Returns 0.
ADD_REPLAYS = Script(
    "add_replays",
    """
if ARGV[3] ~= '' and not redis.call('SET', KEYS[3], '1', 'NX', 'EX', 3600) then
    return 0
end
local record = redis.call('HMGET', KEYS[1], 'state', 'expires_at')
if record[1] == 'completed' and tonumber(record[2]) > tonumber(ARGV[1]) then
    redis.call('HINCRBY', KEYS[1], 'replays', ARGV[2])
end
return 0
""",
)
