"""The SQL of the usage reconciliation (:mod:`payonce.reconcile.usage_analysis` runs it).

Tables, in the order they are made: ``billed_rows``/``cost_rows`` (the reports, later
files winning on repeats), ``grid`` and ``report_buckets`` (each report's buckets,
numbered ``k`` on its grid), ``repeated`` (hashes of business ids on several lines,
from a first pass over the logs), ``counted`` (the calls counted per path, tenant,
model and bucket number as a second pass reads them, the calls of ``repeated``
also listed), ``lines`` (those groups placed in their provider, bucket and key),
``flags`` (the listed business requests' first and needed calls),
``logged``/``billed``/``cells`` (the comparison per provider, bucket, model and
key) and ``period``.
"""

from __future__ import annotations

__all__ = [
    "CALL",
    "CELLS",
    "COST_DAYS",
    "COUNTED",
    "DERIVED",
    "FLAGS",
    "HASHES",
    "LINES",
    "LOGGED",
    "OFF_GRID",
    "PERIOD_CELLS",
    "RAW",
    "REPEATED",
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

# The first pass over a call log: the 64-bit hash of every business id (integers
# sort and compare several times faster than strings). A hash seen once is a
# business request on one line: the second pass counts its calls straight into
# cells. The hashes seen twice are found by sorting them, not by grouping: a hash
# table of a hundred million distinct hashes spilled at 4 GiB, the sort did not.
HASHES = """
SELECT hash(business_id) AS hb FROM ({relation}) WHERE business_id IS NOT NULL
"""

REPEATED = """
CREATE TABLE repeated AS
SELECT DISTINCT hb FROM (SELECT hb, lag(hb) OVER (ORDER BY hb) AS prev FROM hashes)
WHERE hb = prev;
DROP TABLE hashes;
"""

# The second pass: each call as it is read, reduced to what its cell needs. Only
# integer arithmetic and raw columns here, no CASE: this runs on every call. The
# provider (from the path), the bucket (from k, the bucket number on each grid:
# origin + k x width), the key (from the tenant) and the model's cell are found
# once the calls are counted, on a few thousand groups. ``flags`` packs whether
# it was an upstream call (bit 1), succeeded (2), had no business id (4), no
# usage (8), no cost (16), no timestamp (32).
CALL = """
SELECT c.src, c.pos * (c.reason IS NOT NULL)::BIGINT AS pos, c.reason, c.endpoint, c.tag,
       c.model, {grid_columns},
       -- Sent: it made an upstream attempt (v2), or was forwarded (v1), or the log
       -- does not say (a generic log: every line is a call). Counted: answered 2xx,
       -- or cancelled after it was sent (the provider may have billed it).
       (coalesce(c.upstream_attempts > 0, c.outcome IN ('forwarded', 'passthrough', 'error'),
                 true)
        AND ((c.upstream_status IS NULL AND c.upstream_cancelled IS NULL AND c.outcome IS NULL
              AND c.success)
             OR (NOT (c.upstream_status IS NULL AND c.upstream_cancelled IS NULL
                      AND c.outcome IS NULL)
                 AND (coalesce(c.upstream_status BETWEEN 200 AND 299, false)
                      OR coalesce(c.upstream_cancelled, false)))))::INTEGER
       + 2 * c.success::INTEGER + 4 * (c.business_id IS NULL)::INTEGER
       + 8 * (c.input_tokens IS NULL AND c.output_tokens IS NULL)::INTEGER
       + 16 * (c.cost_usd IS NULL)::INTEGER + 32 * (c.ts IS NULL)::INTEGER AS flags,
       c.input_tokens, c.output_tokens, c.cost_usd AS cost, c.business_id, c.ts,
       -- A membership test (a mark join), not a LEFT JOIN: DuckDB cannot estimate a
       -- CSV file's rows, so it built the join's hash table from the calls, every
       -- column of every call, and probed it with ``repeated``. This way the hash
       -- table is ``repeated``'s and the calls stream past it (0.83x the pass's CPU at 10M).
       c.business_id IS NOT NULL AND hash(c.business_id) IN (SELECT hb FROM repeated)
           AS repeated
FROM ({relation}) c
"""

# The calls counted per cell as they are read. A call of a business id whose hash
# was seen more than once is counted like the others, and also listed (its id,
# time and cost) for the business requests on several lines to be sorted out
# afterwards (``FLAGS``). A malformed line is a group of its own (its line number
# is listed).
COUNTED = """
SELECT src, pos, reason, endpoint, tag, model, {grid_names}, flags,
       count(*) AS n, sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens,
       sum(cost) AS cost,
       list({{'b': business_id, 't': ts, 'c': cost}}) FILTER (repeated) AS repeats
FROM ({call}) GROUP BY ALL
"""

# The counted groups, placed: provider by path, bucket on its provider's grid (NULL
# outside it), key cell, and why a group is not compared (``outside``).
LINES = """
CREATE TABLE lines AS
SELECT gid, src, provider, cost_provider, bucket, cost_bucket, kd, model,
       CASE WHEN provider IS NULL THEN 'endpoints the usage reports do not cover'
            WHEN NOT ({gridded}) THEN 'no usage report for their provider'
            WHEN flags & 32 <> 0 THEN 'no timestamp'
            WHEN bucket IS NULL THEN 'outside the usage reports'' buckets' END AS outside,
       n, flags & 1 <> 0 AS upstream, flags & 2 <> 0 AS ok, flags & 4 <> 0 AS unkeyed,
       flags & 8 <> 0 AS no_usage, flags & 16 <> 0 AS no_cost,
       input_tokens, output_tokens, cost
FROM (
    SELECT c.*, {bucket} AS bucket, {cost_bucket} AS cost_bucket, {kd} AS kd
    FROM (
        SELECT rowid AS gid, *,
               CASE WHEN suffix(endpoint, '/v1/messages') THEN 'anthropic'
                    WHEN suffix(endpoint, '/v1/chat/completions')
                      OR suffix(endpoint, '/v1/completions')
                      OR suffix(endpoint, '/v1/responses') THEN 'openai'
                    WHEN endpoint IS NULL THEN {only_provider} END AS provider,
               CASE WHEN suffix(endpoint, '/v1/messages') THEN 'anthropic'
                    WHEN endpoint IS NULL THEN {only_provider} ELSE 'openai' END AS cost_provider
        FROM counted
    ) c
    {keymap_join}
);
"""

# Business requests with several lines: for each, its first line (where it is
# counted), whether it succeeded, and the upstream call it needed (the cheapest,
# then the earliest); its other upstream calls are duplicates. ``flags`` says, per
# counted group, how many of its listed calls are first lines, or needed.
FLAGS = """
CREATE TEMP TABLE repeat_lines AS
SELECT gid, r.b AS b, r.t AS t, r.c AS c
FROM (SELECT rowid AS gid, unnest(repeats) AS r FROM counted WHERE repeats IS NOT NULL);
DROP TABLE counted;
CREATE TEMP TABLE per_business AS
SELECT b, arg_min(lid, (t, lid)) AS first_lid, bool_or(ok) AS ok,
       arg_min(lid, (coalesce(c, {no_cost}), t, lid)) FILTER (upstream) AS kept_lid
FROM (SELECT x.rowid AS lid, x.b, x.t, x.c, l.ok, l.upstream
      FROM repeat_lines x JOIN lines l USING (gid))
GROUP BY b;
CREATE TEMP TABLE flags AS
SELECT x.gid, count(*) AS m, count(*) FILTER (x.lid = p.first_lid) AS firsts,
       count(*) FILTER (x.lid = p.first_lid AND p.ok) AS firsts_ok,
       count(*) FILTER (x.lid IS NOT DISTINCT FROM p.kept_lid) AS kept,
       coalesce(sum(x.c), 0) AS repeat_cost,
       coalesce(sum(x.c) FILTER (x.lid IS NOT DISTINCT FROM p.kept_lid), 0) AS kept_cost
FROM (SELECT rowid AS lid, gid, b, c FROM repeat_lines) x JOIN per_business p USING (b)
GROUP BY x.gid;
"""

CELLS = """
CREATE TABLE logged_models AS
SELECT provider, bucket, NULL::TIMESTAMPTZ AS bucket_start, model, kd,
       coalesce(sum(n) FILTER (upstream), 0) AS logged_upstream_calls,
       -- Every retry sent without a key (no business id) duplicates an unnamed call.
       coalesce(sum(n) FILTER (upstream AND unkeyed), 0)
           + coalesce(sum(f.m - f.kept) FILTER (upstream), 0) AS duplicate_requests,
       coalesce(sum(input_tokens) FILTER (upstream), 0) AS logged_input_tokens,
       coalesce(sum(output_tokens) FILTER (upstream), 0) AS logged_output_tokens,
       coalesce(sum(n) FILTER (upstream AND no_usage), 0) AS unknown_usage_calls,
       coalesce(sum(cost) FILTER (upstream), 0) AS logged_cost_usd,
       coalesce(sum(cost) FILTER (upstream AND unkeyed), 0)
           + coalesce(sum(f.repeat_cost - f.kept_cost) FILTER (upstream), 0) AS wasted_cost_usd,
       coalesce(sum(n) FILTER (upstream AND no_cost), 0) AS unpriced_calls,
       -- A business request is counted in the bucket of its first line; a business
       -- id on one line is a business request there.
       coalesce(sum(n - coalesce(f.m, 0) + coalesce(f.firsts, 0)) FILTER (NOT unkeyed), 0)
           AS business_requests,
       coalesce(sum((n - coalesce(f.m, 0)) * ok::INTEGER + coalesce(f.firsts_ok, 0))
           FILTER (NOT unkeyed), 0) AS successful_business_requests
FROM lines LEFT JOIN flags f USING (gid)
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
    FROM (SELECT cost_provider, cost_bucket, sum(cost) AS logged FROM lines
          WHERE upstream AND cost_bucket IS NOT NULL GROUP BY ALL) s
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
