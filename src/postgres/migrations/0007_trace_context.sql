-- One trace from the request that caused an effect to its delivery (W3C
-- Trace Context). A row keeps the trace context it was enqueued under; the
-- relay sends every publish attempt as a new span of that trace
-- (src/http/trace_context.rs). Runs inside the migrator's transaction.

-- The context, as given: the first 55 bytes of a valid traceparent (the
-- version, trace id, parent id and flags; what a later version appends is
-- not kept), and the tracestate that goes with it. NULL without one.
ALTER TABLE idemgate.outbox ADD COLUMN traceparent text, ADD COLUMN tracestate text;

-- What a trace_context argument may be, as 'SQLSTATE:message' (NULL when
-- it is fine): NULL, or an object whose only members are "traceparent"
-- and "tracestate", strings or null, as an OpenTelemetry propagator's
-- carrier holds them. A malformed value inside is not refused but ignored,
-- as the Recommendation asks of every receiver: tracing must never fail a
-- service's transaction.
CREATE FUNCTION idemgate.trace_context_fault(trace_context jsonb)
RETURNS text LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN jsonb_typeof($1) <> 'object'
                  OR EXISTS (SELECT 1 FROM jsonb_each($1) e
                              WHERE e.key NOT IN ('traceparent', 'tracestate')
                                 OR jsonb_typeof(e.value) NOT IN ('string', 'null'))
           THEN '22023:trace_context must be a JSON object with at most "traceparent" and "tracestate", each a string'
           END
$$;

-- The context a row is stored with, as ARRAY[traceparent, tracestate]:
-- from `given` or, when it is NULL, from the transaction's settings
-- `idemgate.traceparent` and `idemgate.tracestate` (SET LOCAL, for
-- services that cannot change every call; their names are the same
-- whatever the outbox's schema). NULL when there is no valid traceparent:
-- version-traceid-parentid-flags in lower-case hex, version ff invalid,
-- version 00 exactly 55 bytes, ids not all zeros. A tracestate over 512
-- bytes or with a character outside printable ASCII is dropped.
CREATE FUNCTION idemgate.trace_context(given jsonb)
RETURNS text[] LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    tp text;
    ts text;
BEGIN
    IF given IS NULL THEN
        -- Written so that a schema other than idemgate keeps these names.
        tp := current_setting('idemgate' || '.traceparent', true);
        ts := current_setting('idemgate' || '.tracestate', true);
    ELSE
        tp := given ->> 'traceparent';
        ts := given ->> 'tracestate';
    END IF;
    IF tp IS NULL
       OR tp !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[\x21-\x7e]*)?$'
       OR left(tp, 2) = 'ff' OR (left(tp, 2) = '00' AND octet_length(tp) <> 55)
       OR substr(tp, 4, 32) = repeat('0', 32) OR substr(tp, 37, 16) = repeat('0', 16) THEN
        RETURN NULL;
    END IF;
    IF ts = '' OR octet_length(ts) > 512 OR ts !~ '^[\x20-\x7e]*$' THEN
        ts := NULL;
    END IF;
    RETURN ARRAY[left(tp, 55), ts];
END
$$;

-- enqueue and enqueue_many gain a last argument, so they are replaced;
-- every role granted either keeps its grant on the new ones.
CREATE TEMPORARY TABLE enqueue_grantees ON COMMIT DROP AS
SELECT DISTINCT a.grantee::regrole::text AS role
  FROM pg_proc p, aclexplode(p.proacl) a
 WHERE p.oid IN ('idemgate.enqueue(text, text, text, jsonb, text, jsonb)'::regprocedure,
                 'idemgate.enqueue_many(text[], text[], text[], jsonb[], text[], jsonb[])'::regprocedure)
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner;

DROP FUNCTION idemgate.enqueue(text, text, text, jsonb, text, jsonb);
DROP FUNCTION idemgate.enqueue_many(text[], text[], text[], jsonb[], text[], jsonb[]);

-- As in migrations 4 and 5, plus trace_context (see idemgate.trace_context):
-- refused, after the headers and before the payload's size, only when it
-- is not an object of the two strings; and an empty or blank ordering key
-- is refused after the business key.
CREATE FUNCTION idemgate.enqueue(
    destination   text,
    operation     text,
    business_key  text,
    payload       jsonb,
    ordering_key  text  DEFAULT NULL,
    headers       jsonb DEFAULT '{}',
    trace_context jsonb DEFAULT NULL
) RETURNS text LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    derived      text;
    seq          bigint;
    new_id       bigint;
    outbox_name  text;
    cap          bigint;
    size         bigint;
    fault        text;
    trace        text[];
BEGIN
    IF enqueue.destination IS NULL OR enqueue.operation IS NULL OR enqueue.business_key IS NULL
       OR enqueue.payload IS NULL THEN
        RAISE EXCEPTION 'enqueue: destination, operation, business_key and payload are required'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF enqueue.business_key ~ '^[ \t\n\r\v\f]*$' THEN
        RAISE EXCEPTION 'enqueue: business_key must not be empty or only whitespace'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A blank ordering key would put every such message in one global line.
    IF enqueue.ordering_key ~ '^[ \t\n\r\v\f]*$' THEN
        RAISE EXCEPTION 'enqueue: ordering_key must not be empty or only whitespace (NULL means no order)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Most messages carry no headers: skip the check (µs per enqueue).
    IF enqueue.headers IS NOT NULL AND enqueue.headers <> '{}' THEN
        fault := idemgate.headers_fault(enqueue.headers);
    END IF;
    IF fault IS NULL AND enqueue.trace_context IS NOT NULL THEN
        fault := idemgate.trace_context_fault(enqueue.trace_context);
    END IF;
    IF fault IS NOT NULL THEN
        RAISE EXCEPTION 'enqueue: %', substr(fault, 7) USING ERRCODE = left(fault, 5);
    END IF;
    SELECT s.outbox, s.max_payload INTO outbox_name, cap FROM idemgate.settings s;
    size := octet_length(enqueue.payload::text);
    IF size > cap THEN
        RAISE EXCEPTION 'enqueue: payload is % bytes, more than max_payload (% bytes)', size, cap
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    derived := idemgate.derived_key(outbox_name, enqueue.destination, enqueue.operation, enqueue.business_key);
    -- Most enqueues have no trace context: no call unless there is one to read.
    IF enqueue.trace_context IS NOT NULL OR current_setting('idemgate' || '.traceparent', true) <> '' THEN
        trace := idemgate.trace_context(enqueue.trace_context);
    END IF;

    -- Taken before the insert, so the row is born with its place in line.
    -- A duplicate burns a number; gaps are harmless (heads are found by
    -- "no earlier row", not by "next number").
    IF enqueue.ordering_key IS NOT NULL THEN
        INSERT INTO idemgate.ordering_keys AS s (ordering_key, last_seq) VALUES (enqueue.ordering_key, 1)
        ON CONFLICT (ordering_key) DO UPDATE SET last_seq = s.last_seq + 1, updated_at = clock_timestamp()
        RETURNING s.last_seq INTO seq;
    END IF;

    -- Waits for a concurrent transaction holding the same key, then
    -- inserts only if it is gone.
    INSERT INTO idemgate.outbox (derived_key, destination, operation, business_key, payload, headers,
                                 ordering_key, ordering_seq, traceparent, tracestate)
    VALUES (derived, enqueue.destination, enqueue.operation, enqueue.business_key, enqueue.payload,
            coalesce(enqueue.headers, '{}'), enqueue.ordering_key, seq, trace[1], trace[2])
    ON CONFLICT (derived_key) DO NOTHING
    RETURNING id INTO new_id;
    IF new_id IS NULL THEN
        RETURN derived;
    END IF;

    -- A fresh statement snapshot: it sees a delivery that committed while
    -- the insert above waited (the row moved to history in one statement).
    IF EXISTS (SELECT 1 FROM idemgate.delivered d WHERE d.derived_key = derived) THEN
        DELETE FROM idemgate.outbox WHERE id = new_id;
        RETURN derived;
    END IF;

    PERFORM pg_notify('idemgate_outbox', '');
    RETURN derived;
END
$$;

-- As in migration 6, plus trace_context[i] for message i: NULL as a whole
-- (or a NULL element) means the transaction's settings, read once per call;
-- and the history probe after the insert is a semi-join.
CREATE FUNCTION idemgate.enqueue_many(
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
    -- inserts only those that are gone. Rows go in in input order, so a
    -- repeat within the call conflicts with the first and is a no-op.
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

REVOKE EXECUTE ON FUNCTION idemgate.trace_context_fault(jsonb), idemgate.trace_context(jsonb),
                           idemgate.enqueue(text, text, text, jsonb, text, jsonb, jsonb),
                           idemgate.enqueue_many(text[], text[], text[], jsonb[], text[], jsonb[], jsonb[]) FROM PUBLIC;

DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT role FROM enqueue_grantees LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION idemgate.enqueue(text, text, text, jsonb, text, jsonb, jsonb), '
                       'idemgate.enqueue_many(text[], text[], text[], jsonb[], text[], jsonb[], jsonb[]) TO %s',
                       r.role);
    END LOOP;
END
$$;
