-- Set-based enqueue: many messages in one call, at the speed of one
-- INSERT ... SELECT instead of one function call (and its statements)
-- per row. Runs inside the migrator's transaction.

-- What idemgate.enqueue would refuse in a message's headers, as
-- 'SQLSTATE:message' (NULL when they are fine): the same checks, in the
-- same order (names in byte order), with the same words. Called by
-- enqueue_many only for rows whose headers are not empty.
CREATE FUNCTION idemgate.headers_fault(headers jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    header_bytes bigint := 0;
    h            record;
BEGIN
    IF jsonb_typeof(headers) <> 'object' THEN
        RETURN '22023:headers must be a JSON object of strings';
    END IF;
    FOR h IN SELECT e.key, e.value FROM jsonb_each(headers) e ORDER BY e.key COLLATE "C"
    LOOP
        IF h.key !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' THEN
            RETURN format('22023:headers: "%s" is not a valid header name', h.key);
        END IF;
        IF lower(h.key) IN ('content-length', 'transfer-encoding', 'host', 'connection', 'keep-alive', 'te',
                            'trailer', 'upgrade', 'proxy-authorization', 'proxy-connection', 'idempotency-key') THEN
            RETURN format('22023:headers: "%s" is set by the relay or the connection, not per message', h.key);
        END IF;
        IF jsonb_typeof(h.value) <> 'string' OR (h.value #>> '{}') !~ '^[\t\x20-\x7e]*$' THEN
            RETURN format('22023:headers: the value of "%s" must be a string of printable ASCII', h.key);
        END IF;
        header_bytes := header_bytes + octet_length(h.key) + octet_length(h.value #>> '{}');
    END LOOP;
    IF header_bytes > 8192 THEN
        RETURN format('54000:headers are %s bytes, more than 8192', header_bytes);
    END IF;
    RETURN NULL;
END
$$;

-- Enqueues message i of every array, i = 1 .. n, as
-- idemgate.enqueue(destination[i], operation[i], business_key[i],
-- payload[i], ordering_key[i], headers[i]) would, one after the other, in
-- one call; returns the n derived keys in input order. ordering_key and
-- headers may be NULL as a whole (no message has one) or hold NULLs.
--
-- Row by row it means what enqueue means: a key waiting, dead or
-- delivered within the history retention is a no-op, and so is a repeat
-- of a key earlier in the same call (the first one wins). A refused
-- message fails the whole call (and the caller's transaction) with
-- enqueue's SQLSTATE and words after 'enqueue_many: row N (0-based): ',
-- N the message's position counting from 0 (the SQL array element N + 1,
-- the Rust slice index N); the first refused row in input order is the
-- one named. Arrays of different lengths are refused (22023) before any
-- row.
--
-- Ordering: the per-key bookkeeping is two index-probed writes per
-- distinct ordering key per call, not one per row. The call locks its keys'
-- rows in idemgate.ordering_keys (in byte order, so two calls sharing keys
-- cannot deadlock each other) until the caller's transaction ends, as
-- enqueue does, so enqueuers of one key are serialised and sequence order
-- is commit order. Under those locks it takes B, the highest last number
-- of any of its keys, gives the message at position i the number B + i,
-- and sets each key's last number to B + n: within the call a key's
-- messages are in input order, and every one of them comes after all
-- that committed before. The gaps this leaves are harmless (heads are
-- found by "no earlier row", not by "next number").
CREATE FUNCTION idemgate.enqueue_many(
    destination  text[],
    operation    text[],
    business_key text[],
    payload      jsonb[],
    ordering_key text[]  DEFAULT NULL,
    headers      jsonb[] DEFAULT NULL
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
BEGIN
    IF enqueue_many.destination IS NULL OR enqueue_many.operation IS NULL
       OR enqueue_many.business_key IS NULL OR enqueue_many.payload IS NULL THEN
        RAISE EXCEPTION 'enqueue_many: destination, operation, business_key and payload are required'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF cardinality(enqueue_many.operation) <> n OR cardinality(enqueue_many.business_key) <> n
       OR cardinality(enqueue_many.payload) <> n OR cardinality(enqueue_many.ordering_key) <> n
       OR cardinality(enqueue_many.headers) <> n THEN
        RAISE EXCEPTION 'enqueue_many: every array must hold one element per message: destination has %, '
                        'operation %, business_key %, payload %, ordering_key %, headers %', n,
                        cardinality(enqueue_many.operation), cardinality(enqueue_many.business_key),
                        cardinality(enqueue_many.payload), coalesce(cardinality(enqueue_many.ordering_key)::text, 'NULL'),
                        coalesce(cardinality(enqueue_many.headers)::text, 'NULL')
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
                      OR octet_length(u.p::text) > cap THEN NULL
                 ELSE encode(sha256(prefix ||
                          int8send(octet_length(convert_to(u.d, 'UTF8'))::int8) || convert_to(u.d, 'UTF8') ||
                          int8send(octet_length(convert_to(u.o, 'UTF8'))::int8) || convert_to(u.o, 'UTF8') ||
                          int8send(octet_length(convert_to(u.b, 'UTF8'))::int8) || convert_to(u.b, 'UTF8')), 'hex')
               END
          FROM (SELECT unnest(enqueue_many.destination) AS d, unnest(enqueue_many.operation) AS o,
                       unnest(enqueue_many.business_key) AS b, unnest(enqueue_many.payload) AS p,
                       unnest(enqueue_many.headers) AS h) u);
    bad := array_position(keys, NULL);
    IF bad IS NOT NULL THEN
        -- The first refused row, and the first of its faults in enqueue's order.
        SELECT CASE
                 WHEN u.d IS NULL OR u.o IS NULL OR u.b IS NULL OR u.p IS NULL THEN
                     '22004:destination, operation, business_key and payload are required'
                 WHEN u.b ~ '^[ \t\n\r\v\f]*$' THEN '22023:business_key must not be empty or only whitespace'
                 WHEN u.h IS NOT NULL AND u.h <> '{}' AND idemgate.headers_fault(u.h) IS NOT NULL THEN
                     idemgate.headers_fault(u.h)
                 ELSE format('54000:payload is %s bytes, more than max_payload (%s bytes)', octet_length(u.p::text), cap)
               END
          INTO fault
          FROM unnest(enqueue_many.destination, enqueue_many.operation, enqueue_many.business_key,
                      enqueue_many.payload, enqueue_many.headers) WITH ORDINALITY AS u(d, o, b, p, h, i)
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
                                 ordering_key, ordering_seq)
    SELECT u.key, u.d, u.o, u.b, u.p, coalesce(u.h, '{}'), u.k, CASE WHEN u.k IS NOT NULL THEN base + u.i END
      FROM (SELECT unnest(keys) AS key, unnest(enqueue_many.destination) AS d, unnest(enqueue_many.operation) AS o,
                   unnest(enqueue_many.business_key) AS b, unnest(enqueue_many.payload) AS p,
                   unnest(enqueue_many.headers) AS h, unnest(enqueue_many.ordering_key) AS k,
                   generate_series(1, n) AS i) u
    ON CONFLICT (derived_key) DO NOTHING;
    GET DIAGNOSTICS inserted = ROW_COUNT;
    IF inserted = 0 THEN
        RETURN keys;
    END IF;

    -- A fresh statement snapshot: it sees a delivery that committed while
    -- the insert above waited (the row moved to history in one statement).
    -- A key in the history is never also waiting in the outbox but as a
    -- row just inserted, so every such row found here is one of this call's.
    again := ARRAY(SELECT d.derived_key FROM idemgate.delivered d WHERE d.derived_key = ANY(keys));
    IF cardinality(again) > 0 THEN
        DELETE FROM idemgate.outbox o WHERE o.derived_key = ANY(again);
    END IF;

    PERFORM pg_notify('idemgate_outbox', '');
    RETURN keys;
END
$$;

REVOKE EXECUTE ON FUNCTION idemgate.headers_fault(jsonb),
                           idemgate.enqueue_many(text[], text[], text[], jsonb[], text[], jsonb[]) FROM PUBLIC;

-- An upgrade gives enqueue_many to every role granted enqueue (a service
-- role granted before this migration): it can do nothing that many calls
-- of enqueue could not.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT a.grantee::regrole AS role
          FROM pg_proc p, aclexplode(p.proacl) a
         WHERE p.oid = 'idemgate.enqueue(text, text, text, jsonb, text, jsonb)'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION idemgate.enqueue_many(text[], text[], text[], jsonb[], text[], jsonb[]) '
                       'TO %s', r.role);
    END LOOP;
END
$$;
