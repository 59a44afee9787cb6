-- Lock order (issue 28). enqueue_many inserts its rows in the order of
-- their keys, whatever the size of the call (see the insert below), so no
-- two calls, nor a call and enqueue, can deadlock on keys they share; and
-- it refuses an empty or blank ordering key, as enqueue does since
-- migration 7. Otherwise the same arguments, answers and refusals as in
-- migration 7, and the same semantics row by row. Replaced in place, so
-- every grant on it stands. maintain_history no longer waits for an
-- ordering key's row that an enqueuer holds (see there). Runs inside the
-- migrator's transaction.

CREATE OR REPLACE FUNCTION idemgate.enqueue_many(
    destination   text[],
    operation     text[],
    business_key  text[],
    payload       jsonb[],
    ordering_key  text[]  DEFAULT NULL,
    headers       jsonb[] DEFAULT NULL,
    trace_context jsonb[] DEFAULT NULL
) RETURNS text[] LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  -- Compiling its big statements costs more than JIT saves running them.
  SET jit = off
  -- Its statements are planned once per session, not at every call: with
  -- custom plans (the default for a call's first five, and then for as
  -- long as they look cheaper) the sorted insert was planned at every
  -- small call. Measured, 3,000 calls of 3 rows in one transaction,
  -- medians of 5: 816 ms unsorted with custom plans, 968 ms sorted (+19 %),
  -- 545 ms sorted with generic plans; 100,000 rows in one call cost the
  -- same either way (3.75 s against 3.88 s, medians of 7, within noise).
  SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    n         bigint := cardinality(enqueue_many.destination);
    cap       bigint;
    -- The outbox's name as the key's first field: length, then bytes.
    prefix    bytea;
    keys      text[];
    bad       integer;
    fault     text;
    locked    text[];
    base      bigint;
    inserted  bigint;
    again     text[];
    -- The transaction's own context, for rows without one of their own.
    ambient   text[] := idemgate.trace_context(NULL);
BEGIN
    IF enqueue_many.destination IS NULL OR enqueue_many.operation IS NULL
       OR enqueue_many.business_key IS NULL OR enqueue_many.payload IS NULL THEN
        RAISE EXCEPTION 'enqueue_many: destination, operation, business_key and payload are required'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF cardinality(enqueue_many.operation) <> n OR cardinality(enqueue_many.business_key) <> n
       OR cardinality(enqueue_many.payload) <> n OR cardinality(enqueue_many.ordering_key) <> n
       OR cardinality(enqueue_many.headers) <> n OR cardinality(enqueue_many.trace_context) <> n THEN
        RAISE EXCEPTION 'enqueue_many: every array must hold one element per message: destination has %, '
                        'operation %, business_key %, payload %, ordering_key %, headers %, trace_context %', n,
                        cardinality(enqueue_many.operation), cardinality(enqueue_many.business_key),
                        cardinality(enqueue_many.payload), coalesce(cardinality(enqueue_many.ordering_key)::text, 'NULL'),
                        coalesce(cardinality(enqueue_many.headers)::text, 'NULL'),
                        coalesce(cardinality(enqueue_many.trace_context)::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF n = 0 THEN
        RETURN ARRAY[]::text[];
    END IF;
    SELECT s.max_payload, int8send(octet_length(convert_to(s.outbox, 'UTF8'))::int8) || convert_to(s.outbox, 'UTF8')
      INTO cap, prefix
      FROM idemgate.settings s;

    -- Every derived key, in input order (the key of idemgate.derived_key,
    -- byte for byte); NULL in place of a message enqueue would refuse.
    keys := ARRAY(
        SELECT CASE
                 WHEN u.d IS NULL OR u.o IS NULL OR u.b IS NULL OR u.p IS NULL
                      OR u.b ~ '^[ \t\n\r\v\f]*$' OR u.k ~ '^[ \t\n\r\v\f]*$'
                      OR (u.h IS NOT NULL AND u.h <> '{}' AND idemgate.headers_fault(u.h) IS NOT NULL)
                      OR (u.t IS NOT NULL AND idemgate.trace_context_fault(u.t) IS NOT NULL)
                      OR octet_length(u.p::text) > cap THEN NULL
                 ELSE encode(sha256(prefix ||
                          int8send(octet_length(convert_to(u.d, 'UTF8'))::int8) || convert_to(u.d, 'UTF8') ||
                          int8send(octet_length(convert_to(u.o, 'UTF8'))::int8) || convert_to(u.o, 'UTF8') ||
                          int8send(octet_length(convert_to(u.b, 'UTF8'))::int8) || convert_to(u.b, 'UTF8')), 'hex')
               END
          FROM (SELECT unnest(enqueue_many.destination) AS d, unnest(enqueue_many.operation) AS o,
                       unnest(enqueue_many.business_key) AS b, unnest(enqueue_many.payload) AS p,
                       unnest(enqueue_many.ordering_key) AS k, unnest(enqueue_many.headers) AS h,
                       unnest(enqueue_many.trace_context) AS t) u);
    bad := array_position(keys, NULL);
    IF bad IS NOT NULL THEN
        -- The first refused row, and the first of its faults in enqueue's order.
        SELECT CASE
                 WHEN u.d IS NULL OR u.o IS NULL OR u.b IS NULL OR u.p IS NULL THEN
                     '22004:destination, operation, business_key and payload are required'
                 WHEN u.b ~ '^[ \t\n\r\v\f]*$' THEN '22023:business_key must not be empty or only whitespace'
                 WHEN u.k ~ '^[ \t\n\r\v\f]*$' THEN
                     '22023:ordering_key must not be empty or only whitespace (NULL means no order)'
                 WHEN u.h IS NOT NULL AND u.h <> '{}' AND idemgate.headers_fault(u.h) IS NOT NULL THEN
                     idemgate.headers_fault(u.h)
                 WHEN u.t IS NOT NULL AND idemgate.trace_context_fault(u.t) IS NOT NULL THEN
                     idemgate.trace_context_fault(u.t)
                 ELSE format('54000:payload is %s bytes, more than max_payload (%s bytes)', octet_length(u.p::text), cap)
               END
          INTO fault
          FROM unnest(enqueue_many.destination, enqueue_many.operation, enqueue_many.business_key,
                      enqueue_many.payload, enqueue_many.ordering_key, enqueue_many.headers,
                      enqueue_many.trace_context)
               WITH ORDINALITY AS u(d, o, b, p, k, h, t, i)
         WHERE u.i = bad;
        RAISE EXCEPTION 'enqueue_many: row % (0-based): %', bad - 1, substr(fault, 7)
            USING ERRCODE = left(fault, 5);
    END IF;

    -- Taken before the insert, so the rows are born with their places in
    -- line; in byte order, so two calls sharing ordering keys take them in
    -- one order. A call (like enqueue) locks all its ordering keys first,
    -- then all its derived keys: one global order for both kinds.
    IF enqueue_many.ordering_key IS NOT NULL THEN
        WITH locking AS (
            INSERT INTO idemgate.ordering_keys AS s (ordering_key, last_seq)
            SELECT x.k, 0
              FROM (SELECT DISTINCT u.k FROM unnest(enqueue_many.ordering_key) AS u(k) WHERE u.k IS NOT NULL) x
             ORDER BY x.k COLLATE "C"
            ON CONFLICT (ordering_key) DO UPDATE SET updated_at = clock_timestamp()
            RETURNING s.ordering_key, s.last_seq
        )
        SELECT array_agg(l.ordering_key), max(l.last_seq) INTO locked, base FROM locking l;
        IF locked IS NOT NULL THEN
            UPDATE idemgate.ordering_keys s SET last_seq = base + n WHERE s.ordering_key = ANY(locked);
        END IF;
    END IF;

    -- Waits for a concurrent transaction holding one of the keys, then
    -- inserts only those that are gone; a repeat within the call conflicts
    -- with the first and is a no-op. Every call inserts its rows in the
    -- order of their keys (then of the input), so two calls, or a call and
    -- a single enqueue, that share keys take them in one order: the later
    -- waits for the earlier, and they cannot deadlock whatever the order of
    -- their arrays. (In input order, a call holding x and waiting for a
    -- while another held a and waited for x, failed with 40P01.) The order
    -- also visits each page of the key's index once, where input order
    -- (random in the key) visits one per row: 100,000 rows go in a fifth
    -- faster. The ids then follow the keys, not the input: messages
    -- without an ordering key are delivered in no promised order, and
    -- those with one in ordering_seq order, which is input order.
    INSERT INTO idemgate.outbox (derived_key, destination, operation, business_key, payload, headers,
                                 ordering_key, ordering_seq, traceparent, tracestate)
    SELECT u.key, u.d, u.o, u.b, u.p, coalesce(u.h, '{}'), u.k, CASE WHEN u.k IS NOT NULL THEN base + u.i END,
           x.trace[1], x.trace[2]
      FROM (SELECT unnest(keys) AS key, unnest(enqueue_many.destination) AS d, unnest(enqueue_many.operation) AS o,
                   unnest(enqueue_many.business_key) AS b, unnest(enqueue_many.payload) AS p,
                   unnest(enqueue_many.headers) AS h, unnest(enqueue_many.ordering_key) AS k,
                   unnest(enqueue_many.trace_context) AS t, generate_series(1, n) AS i) u
     -- A call per row only for the rows given a context of their own.
     CROSS JOIN LATERAL (SELECT CASE WHEN u.t IS NULL THEN ambient ELSE idemgate.trace_context(u.t) END AS trace) x
     ORDER BY u.key COLLATE "C", u.i
    ON CONFLICT (derived_key) DO NOTHING;
    GET DIAGNOSTICS inserted = ROW_COUNT;
    IF inserted = 0 THEN
        RETURN keys;
    END IF;

    -- A fresh statement snapshot: it sees a delivery that committed while
    -- the insert above waited (the row moved to history in one statement).
    -- A key in the history is never also waiting in the outbox but as a
    -- row just inserted, so every such row found here is one of this call's.
    -- A semi-join: "= ANY(keys)" sorted the keys and descended every history
    -- partition's index once per key (260-1,000 ms per 100,000 keys on an
    -- empty history); this probes each key once (9-32 ms).
    again := ARRAY(SELECT d.derived_key FROM idemgate.delivered d WHERE d.derived_key IN (SELECT unnest(keys)));
    IF cardinality(again) > 0 THEN
        DELETE FROM idemgate.outbox o WHERE o.derived_key = ANY(again);
    END IF;

    PERFORM pg_notify('idemgate_outbox', '');
    RETURN keys;
END
$$;

-- As in migration 5, but for its last statement. A sequence row may go once
-- its key has no row waiting; the rows are locked with SKIP LOCKED, so
-- retention never waits for an enqueuer that holds one (it is using it, so
-- it is not to be deleted anyway). Deleted as before, in whatever order the
-- scan met them, the job waited on a row a call held while holding another
-- that call was about to take: a deadlock (40P01) that could fail the
-- service's transaction. A row an enqueuer updated and committed after the
-- job's snapshot is rechecked by the lock on its newest version, and an
-- enqueuer that waits for a row being deleted inserts a fresh one.
CREATE OR REPLACE FUNCTION idemgate.maintain_history(retention interval)
RETURNS void LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    day   date;
    part  record;
    upper_bound timestamptz;
BEGIN
    IF retention IS NULL OR retention < interval '1 hour' THEN
        RAISE EXCEPTION 'maintain_history: retention must be at least 1 hour, not %', retention
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtext('idemgate.maintain_history')) THEN
        RETURN;
    END IF;
    FOR i IN 0..2 LOOP
        day := today + i;
        IF to_regclass(format('idemgate.delivered_%s', to_char(day, 'YYYYMMDD'))) IS NULL THEN
            BEGIN
                EXECUTE format(
                    'CREATE TABLE idemgate.%I PARTITION OF idemgate.delivered FOR VALUES FROM (%L) TO (%L)',
                    'delivered_' || to_char(day, 'YYYYMMDD'),
                    (day::timestamp AT TIME ZONE 'UTC'), ((day + 1)::timestamp AT TIME ZONE 'UTC'));
            EXCEPTION WHEN check_violation THEN
                -- The default partition already holds rows of that day (no
                -- partition existed when they were delivered); they stay
                -- there and are deleted by retention below.
                NULL;
            END;
        END IF;
    END LOOP;
    FOR part IN
        SELECT c.relname FROM pg_inherits i
          JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'idemgate.delivered'::regclass AND c.relname ~ '^delivered_[0-9]{8}$'
    LOOP
        upper_bound := (to_date(substring(part.relname from 11), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC';
        IF upper_bound <= now() - retention THEN
            EXECUTE format('DROP TABLE idemgate.%I', part.relname);
        END IF;
    END LOOP;
    DELETE FROM idemgate.delivered_default WHERE delivered_at < now() - retention;
    DELETE FROM idemgate.ordering_keys s
     USING (SELECT k.ordering_key FROM idemgate.ordering_keys k
             WHERE k.updated_at < clock_timestamp() - interval '1 day'
               AND NOT EXISTS (SELECT 1 FROM idemgate.outbox o WHERE o.ordering_key = k.ordering_key)
               FOR UPDATE OF k SKIP LOCKED) idle
     WHERE s.ordering_key = idle.ordering_key;
END
$$;
