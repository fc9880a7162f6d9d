"""The SQL of the usage reconciliation (:mod:`payonce.reconcile.usage_analysis` runs it).

Tables, in the order they are made: ``billed_rows``/``cost_rows`` (the reports, later
files winning on repeats), ``grid`` and ``report_buckets`` (each report's buckets,
numbered ``k`` on its grid), ``placed`` (each call, bucketed as it is read),
``flags`` (business ids on several lines), ``logged``/``billed``/``cells`` (the
comparison per provider, bucket, model and key) and ``period``.
"""

from __future__ import annotations

__all__ = [
    "CELLS",
    "COST_DAYS",
    "DERIVED",
    "FLAGS",
    "LOGGED",
    "OFF_GRID",
    "PERIOD_CELLS",
    "PLACED",
    "PLACED_COLUMNS",
    "RAW",
    "SETUP",
    "SUMS",
]

SETUP = r"""
CREATE MACRO model_key(x) AS
    regexp_replace(x, '-([0-9]{4}-[0-9]{2}-[0-9]{2}|[0-9]{8}|latest)$', '');
-- A result repeated across files (two overlapping fetches): the later file wins,
-- since the earlier one may have fetched a bucket that was still filling.
CREATE TABLE billed_rows AS SELECT * FROM usage QUALIFY row_number() OVER (
    PARTITION BY provider, bucket_start, bucket_end, model, api_key_id, project_id,
                 user_id, service_tier, context_window ORDER BY src DESC) = 1;
CREATE TABLE cost_rows AS SELECT * FROM costs QUALIFY row_number() OVER (
    PARTITION BY provider, bucket_start, bucket_end, project_id, line_item, model
    ORDER BY src DESC) = 1;
CREATE TABLE grid AS
SELECT provider, usage, min(epoch(bucket_start))::BIGINT AS origin,
       mode(epoch(bucket_end) - epoch(bucket_start))::BIGINT AS width
FROM (SELECT DISTINCT provider, usage, bucket_start, bucket_end FROM export_buckets)
GROUP BY provider, usage;
-- k numbers a bucket on its grid, so a call finds its bucket by integer arithmetic.
CREATE TABLE report_buckets AS
SELECT b.*, (epoch(b.bucket_start)::BIGINT - g.origin) // g.width AS k
FROM (SELECT DISTINCT provider, usage, bucket_start, bucket_end FROM export_buckets) b
JOIN grid g USING (provider, usage);
"""

OFF_GRID = """
SELECT b.provider, b.usage, g.width, epoch(b.bucket_end) - epoch(b.bucket_start) AS seen
FROM report_buckets b JOIN grid g USING (provider, usage)
WHERE (epoch(b.bucket_start)::BIGINT - g.origin) % g.width <> 0
   OR epoch(b.bucket_end) - epoch(b.bucket_start) > g.width
   -- Only the last bucket may be shorter: a report cut at its end time.
   OR (epoch(b.bucket_end) - epoch(b.bucket_start) < g.width AND b.bucket_start < (
       SELECT max(bucket_start) FROM report_buckets l
       WHERE l.provider = b.provider AND l.usage = b.usage))
   OR (SELECT count(*) FROM report_buckets o WHERE o.provider = b.provider
       AND o.usage = b.usage AND o.bucket_start = b.bucket_start) > 1
LIMIT 1
"""

# Each call as it is read: which provider, whether it was an upstream call, its
# bucket (the report's grid: origin + k x width) and its key cell. The model is
# kept as written and mapped to its cell only once the calls are counted (a
# regular expression on every call was a third of the time).
PLACED_COLUMNS = """
src INTEGER, pos BIGINT, reason VARCHAR, hb UBIGINT, business_id VARCHAR,
ts TIMESTAMPTZ, success BOOLEAN, cost DECIMAL(18,10), input_tokens BIGINT,
output_tokens BIGINT, model VARCHAR, provider VARCHAR, cost_provider VARCHAR,
upstream_call BOOLEAN, bucket BIGINT, cost_bucket BIGINT, kd VARCHAR, outside VARCHAR
"""

PLACED = """
SELECT c.src, c.pos, c.reason, hash(c.business_id) AS hb, c.business_id, c.ts, c.success,
       c.cost_usd AS cost, c.input_tokens, c.output_tokens, c.model, c.provider,
       c.cost_provider,
       -- Sent: it made an upstream attempt (v2), or was forwarded (v1), or the log
       -- does not say (a generic log: every line is a call). Counted: answered 2xx,
       -- or cancelled after it was sent (the provider may have billed it).
       coalesce(c.upstream_attempts > 0, c.outcome IN ('forwarded', 'passthrough', 'error'), true)
       AND CASE WHEN c.upstream_status IS NULL AND c.upstream_cancelled IS NULL
                     AND c.outcome IS NULL THEN c.success
                ELSE coalesce(c.upstream_status BETWEEN 200 AND 299, false)
                     OR coalesce(c.upstream_cancelled, false) END AS upstream_call,
       {bucket} AS bucket,
       {cost_bucket} AS cost_bucket,
       {kd} AS kd,
       CASE WHEN c.provider IS NULL THEN 'endpoints the usage reports do not cover'
            WHEN NOT ({gridded}) THEN 'no usage report for their provider'
            WHEN c.ts IS NULL THEN 'no timestamp'
            WHEN {bucket} IS NULL THEN 'outside the usage reports'' buckets' END AS outside
FROM (
    SELECT *,
           CASE WHEN suffix(endpoint, '/v1/messages') THEN 'anthropic'
                WHEN suffix(endpoint, '/v1/chat/completions')
                  OR suffix(endpoint, '/v1/completions')
                  OR suffix(endpoint, '/v1/responses') THEN 'openai'
                WHEN endpoint IS NULL THEN {only_provider} END AS provider,
           CASE WHEN suffix(endpoint, '/v1/messages') THEN 'anthropic'
                WHEN endpoint IS NULL THEN {only_provider} ELSE 'openai' END AS cost_provider
    FROM ({relation})
) c
{keymap_join}
"""

# Business requests with several lines, found by a 64-bit hash first (integers
# group several times faster than strings; a collision only adds a candidate,
# since ``per_business`` groups the exact ids). For each: its first line (where
# it is counted), whether it succeeded, and the upstream call it needed (the
# cheapest, then the earliest); its other upstream calls are duplicates.
FLAGS = """
CREATE TEMP TABLE repeated AS
SELECT hb FROM placed WHERE business_id IS NOT NULL GROUP BY hb HAVING count(*) > 1;
CREATE TEMP TABLE multi AS
SELECT rowid AS rid, business_id, ts, cost, upstream_call, success FROM placed
WHERE business_id IS NOT NULL AND hb IN (SELECT hb FROM repeated);
CREATE TEMP TABLE per_business AS
SELECT business_id, arg_min(rid, (ts, rid)) AS first_rid, bool_or(success) AS ok,
       arg_min(rid, (coalesce(cost, {no_cost}), ts, rid)) FILTER (upstream_call) AS kept_rid
FROM multi GROUP BY business_id;
CREATE TEMP TABLE flags AS
SELECT m.rid, m.rid <> b.first_rid AS later, b.ok,
       coalesce(m.upstream_call AND m.rid <> b.kept_rid, false) AS dup
FROM multi m JOIN per_business b USING (business_id);
"""

CELLS = """
CREATE TABLE logged_models AS
SELECT provider, bucket, NULL::TIMESTAMPTZ AS bucket_start, model, kd,
       count(*) FILTER (upstream_call) AS logged_upstream_calls,
       -- Every retry sent without a key (no business id) duplicates an unnamed call.
       count(*) FILTER (upstream_call AND (business_id IS NULL OR coalesce(f.dup, false)))
           AS duplicate_requests,
       coalesce(sum(input_tokens) FILTER (upstream_call), 0) AS logged_input_tokens,
       coalesce(sum(output_tokens) FILTER (upstream_call), 0) AS logged_output_tokens,
       count(*) FILTER (upstream_call AND input_tokens IS NULL AND output_tokens IS NULL)
           AS unknown_usage_calls,
       coalesce(sum(cost) FILTER (upstream_call), 0) AS logged_cost_usd,
       coalesce(sum(cost) FILTER (upstream_call AND (business_id IS NULL
           OR coalesce(f.dup, false))), 0) AS wasted_cost_usd,
       count(*) FILTER (upstream_call AND cost IS NULL) AS unpriced_calls,
       -- A business request is counted in the bucket of its first line.
       count(*) FILTER (business_id IS NOT NULL AND NOT coalesce(f.later, false))
           AS business_requests,
       count(*) FILTER (business_id IS NOT NULL AND NOT coalesce(f.later, false)
           AND coalesce(f.ok, success)) AS successful_business_requests
FROM (SELECT rowid AS rid, * FROM placed) LEFT JOIN flags f USING (rid)
WHERE outside IS NULL GROUP BY ALL;

-- Bucket numbers back to the buckets' starts, now that there are few rows.
UPDATE logged_models SET bucket_start = b.bucket_start
FROM report_buckets b WHERE b.usage AND b.provider = logged_models.provider
    AND b.k = logged_models.bucket;

CREATE TABLE model_keys AS
SELECT model, coalesce(model_key(model), {unknown}) AS mk
FROM (SELECT DISTINCT model FROM logged_models UNION SELECT DISTINCT model FROM billed_rows);

CREATE TABLE logged AS
SELECT provider, bucket_start AS bucket, CASE WHEN p.by_model THEN m.mk ELSE '*' END AS mk, kd,
       {logged_sums}
FROM logged_models l JOIN model_keys m ON m.model IS NOT DISTINCT FROM l.model
JOIN providers p USING (provider) GROUP BY ALL;

CREATE TABLE billed AS
SELECT u.provider, u.bucket_start AS bucket,
       CASE WHEN p.by_model THEN m.mk ELSE '*' END AS mk,
       CASE WHEN p.keyed THEN CASE WHEN u.{key_column} IN (SELECT target FROM keymap)
            THEN u.{key_column} ELSE {other_keys} END ELSE '*' END AS kd,
       sum(u.requests) AS billed_requests,
       sum(u.input_tokens) AS billed_input_tokens,
       sum(u.cached_input_tokens) AS billed_cached_input_tokens,
       sum(u.output_tokens) AS billed_output_tokens
FROM billed_rows u JOIN providers p USING (provider)
JOIN model_keys m ON m.model IS NOT DISTINCT FROM u.model GROUP BY ALL;

CREATE TABLE cells AS
SELECT provider, bucket, mk, kd,
       CASE WHEN p.counts_requests THEN coalesce(b.billed_requests, 0) END AS billed_requests,
       coalesce(b.billed_input_tokens, 0) AS billed_input_tokens,
       coalesce(b.billed_cached_input_tokens, 0) AS billed_cached_input_tokens,
       coalesce(b.billed_output_tokens, 0) AS billed_output_tokens,
       coalesce(l.logged_upstream_calls, 0) AS logged_upstream_calls,
       coalesce(l.duplicate_requests, 0) AS duplicate_requests,
       coalesce(l.logged_input_tokens, 0) AS logged_input_tokens,
       coalesce(l.logged_output_tokens, 0) AS logged_output_tokens,
       coalesce(l.unknown_usage_calls, 0) AS unknown_usage_calls,
       coalesce(l.logged_cost_usd, 0) AS logged_cost_usd,
       coalesce(l.wasted_cost_usd, 0) AS wasted_cost_usd,
       coalesce(l.unpriced_calls, 0) AS unpriced_calls,
       coalesce(l.business_requests, 0) AS business_requests,
       coalesce(l.successful_business_requests, 0) AS successful_business_requests
FROM billed b
FULL JOIN logged l USING (provider, bucket, mk, kd)
JOIN providers p USING (provider);
"""

LOGGED = (
    "logged_upstream_calls",
    "duplicate_requests",
    "logged_input_tokens",
    "logged_output_tokens",
    "unknown_usage_calls",
    "logged_cost_usd",
    "wasted_cost_usd",
    "unpriced_calls",
    "business_requests",
    "successful_business_requests",
)

RAW = (
    "billed_requests",
    "billed_input_tokens",
    "billed_cached_input_tokens",
    "billed_output_tokens",
    *LOGGED,
)

# The differences of one cell, from its raw sums and its model's price.
DERIVED = """
SELECT r.*,
       CASE WHEN billed_requests IS NOT NULL
            THEN greatest(0, billed_requests - logged_upstream_calls) END AS unexplained_requests,
       CASE WHEN billed_requests IS NOT NULL
            THEN greatest(0, logged_upstream_calls - billed_requests) END AS unbilled_calls,
       -- Token counts of the provider and the gateway may disagree a little: within the
       -- tolerance that is accounting, not usage, unless the provider billed more
       -- requests than were sent (then the difference is those requests' tokens).
       coalesce(billed_requests > logged_upstream_calls, false) AS more_billed,
       more_billed OR abs(billed_input_tokens - logged_input_tokens)
           > {tolerance} * billed_input_tokens AS in_off,
       more_billed OR abs(billed_output_tokens - logged_output_tokens)
           > {tolerance} * billed_output_tokens AS out_off,
       CASE WHEN in_off THEN greatest(0, billed_input_tokens - logged_input_tokens) ELSE 0 END
           AS unexplained_input_tokens,
       CASE WHEN out_off THEN greatest(0, billed_output_tokens - logged_output_tokens) ELSE 0 END
           AS unexplained_output_tokens,
       CAST((billed_input_tokens - billed_cached_input_tokens) * pr.input
            + billed_cached_input_tokens * pr.cached + billed_output_tokens * pr.output
            AS DECIMAL(18,10)) AS billed_cost_usd,
       CAST(unexplained_input_tokens * pr.input + unexplained_output_tokens * pr.output
            AS DECIMAL(18,10)) AS unexplained_cost_usd,
       coalesce(unexplained_requests > 0 OR unbilled_calls > 0, false) OR in_off OR out_off
           AS flagged
FROM ({relation}) r LEFT JOIN prices pr USING (mk)
"""

SUMS = ", ".join(
    [f"sum({name}) AS {name}" for name in RAW if name != "billed_requests"]
    + [
        # Unknown in any part is unknown in the sum, never a partial number.
        f"CASE WHEN bool_and({name} IS NOT NULL) THEN sum({name}) END AS {name}"
        for name in (
            "billed_requests",
            "unexplained_requests",
            "unbilled_calls",
            "billed_cost_usd",
            "unexplained_cost_usd",
        )
    ]
    + [
        "sum(unexplained_input_tokens) AS unexplained_input_tokens",
        "sum(unexplained_output_tokens) AS unexplained_output_tokens",
        "bool_or(flagged) AS flagged",
    ]
)

PERIOD_CELLS = (
    "SELECT provider, mk, kd, "
    + ", ".join(
        f"CASE WHEN bool_and({name} IS NOT NULL) THEN sum({name}) END AS {name}"
        if name == "billed_requests"
        else f"sum({name}) AS {name}"
        for name in RAW
    )
    + " FROM cells GROUP BY provider, mk, kd"
)

COST_DAYS = """
WITH days AS (
    SELECT provider, bucket_start, bucket_end, sum(amount_usd) AS billed
    FROM cost_rows GROUP BY ALL
), spent AS (
    SELECT b.provider, b.bucket_start, s.logged
    FROM (SELECT cost_provider, cost_bucket, sum(cost) AS logged FROM placed
          WHERE upstream_call AND cost_bucket IS NOT NULL GROUP BY ALL) s
    JOIN report_buckets b ON NOT b.usage AND b.provider = s.cost_provider
        AND b.k = s.cost_bucket
)
SELECT b.provider, b.bucket_start, coalesce(d.billed, 0) AS billed,
       coalesce(s.logged, 0) AS logged
FROM (SELECT * FROM report_buckets WHERE NOT usage) b
LEFT JOIN days d USING (provider, bucket_start)
LEFT JOIN spent s USING (provider, bucket_start)
ORDER BY b.bucket_start, b.provider
"""
