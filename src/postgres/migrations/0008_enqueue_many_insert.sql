-- enqueue_many inserts the rows of a large call in the order of their
-- keys (see the insert below): the same arguments, answers and refusals
-- as in migration 7, and the same semantics row by row. Replaced in place,
-- so every grant on it stands. Runs inside the migrator's transaction.

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
  SET jit = off AS $$
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
                      OR u.b ~ '^[ \t\n\r\v\f]*$'
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
                       unnest(enqueue_many.headers) AS h, unnest(enqueue_many.trace_context) AS t) u);
    bad := array_position(keys, NULL);
    IF bad IS NOT NULL THEN
        -- The first refused row, and the first of its faults in enqueue's order.
        SELECT CASE
                 WHEN u.d IS NULL OR u.o IS NULL OR u.b IS NULL OR u.p IS NULL THEN
                     '22004:destination, operation, business_key and payload are required'
                 WHEN u.b ~ '^[ \t\n\r\v\f]*$' THEN '22023:business_key must not be empty or only whitespace'
                 WHEN u.h IS NOT NULL AND u.h <> '{}' AND idemgate.headers_fault(u.h) IS NOT NULL THEN
                     idemgate.headers_fault(u.h)
                 WHEN u.t IS NOT NULL AND idemgate.trace_context_fault(u.t) IS NOT NULL THEN
                     idemgate.trace_context_fault(u.t)
                 ELSE format('54000:payload is %s bytes, more than max_payload (%s bytes)', octet_length(u.p::text), cap)
               END
          INTO fault
          FROM unnest(enqueue_many.destination, enqueue_many.operation, enqueue_many.business_key,
                      enqueue_many.payload, enqueue_many.headers, enqueue_many.trace_context)
               WITH ORDINALITY AS u(d, o, b, p, h, t, i)
         WHERE u.i = bad;
        RAISE EXCEPTION 'enqueue_many: row % (0-based): %', bad - 1, substr(fault, 7)
            USING ERRCODE = left(fault, 5);
    END IF;

    -- Taken before the insert, so the rows are born with their places in line.
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
    -- with the first and is a no-op. A large call inserts its rows in the
    -- order of their keys (then of the input): that visits each page of the
    -- key's index once, where input order (random in the key) visits one
    -- per row, and made 100,000 rows go in a fifth faster. (Two such calls
    -- that share keys also take them in the same order.) Its ids then
    -- follow the keys, not the input: messages without an ordering key are
    -- delivered in no promised order, and those with one in ordering_seq
    -- order. A small call gains nothing from the sort, and the sort made its insert
    -- be planned at every call (a quarter more time for a call of 3 rows;
    -- with generic plans forced the two cost the same), so it keeps input
    -- order: the two statements differ only in their ORDER BY. (One
    -- statement sorting on CASE WHEN n >= 1000 THEN key END costs small
    -- calls half as much again.)
    IF n >= 1000 THEN
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
    ELSE
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
        ON CONFLICT (derived_key) DO NOTHING;
    END IF;
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
