-- The outbox's own name in every derived key, so two outboxes (two schemas
-- in one database) never hand one destination the same key; and the
-- refusals at enqueue, so a message the relay could not send (or send
-- correctly) fails the service's own transaction instead of failing later,
-- unseen. Runs inside the migrator's transaction.

-- One row of settings.
-- `outbox` is the name every derived key starts with: the schema's name when
-- this migration ran, kept even if the schema is renamed later, so waiting
-- rows and the delivered history keep their keys.
-- `max_payload` is the largest payload enqueue accepts, in bytes of the JSON
-- text the relay sends (payload::text). `idemgate migrate` writes it from
-- relay.max_payload on every run; the relay sizes its claims by it.
CREATE TABLE idemgate.settings (
    only_row    boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    outbox      text    NOT NULL,
    max_payload bigint  NOT NULL DEFAULT 1048576 CHECK (max_payload > 0)
);
INSERT INTO idemgate.settings (outbox)
SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.oid = 'idemgate.outbox'::regclass;

-- hex(sha256(outbox ‖ destination ‖ operation ‖ business_key)), each field
-- written as its UTF-8 length (8 bytes, big endian: int8send) and then its
-- bytes: the encoding of src/idempotency/hash.rs, byte for byte.
CREATE FUNCTION idemgate.derived_key(outbox text, destination text, operation text, business_key text)
RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT encode(sha256(
        int8send(octet_length(convert_to($1, 'UTF8'))::int8) || convert_to($1, 'UTF8') ||
        int8send(octet_length(convert_to($2, 'UTF8'))::int8) || convert_to($2, 'UTF8') ||
        int8send(octet_length(convert_to($3, 'UTF8'))::int8) || convert_to($3, 'UTF8') ||
        int8send(octet_length(convert_to($4, 'UTF8'))::int8) || convert_to($4, 'UTF8')), 'hex')
$$;

-- The key this outbox derives: the three-field form now names the outbox too.
CREATE OR REPLACE FUNCTION idemgate.derived_key(destination text, operation text, business_key text)
RETURNS text LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $$
    SELECT idemgate.derived_key(s.outbox, $1, $2, $3) FROM idemgate.settings s
$$;

-- As in migration 1, but the key names the outbox, and a message is
-- refused (the caller's transaction fails, the error naming the argument)
-- when the relay could not deliver it as meant:
-- - a business_key that is empty or only whitespace (every such message
--   would collapse into one key);
-- - headers that are not an object of strings, a name that is not an HTTP
--   token, a value that is not printable ASCII (space and tab allowed),
--   more than 8 KiB of names and values in all (what common servers
--   accept), or a name the relay or the connection owns: framing and
--   hop-by-hop headers, which could cut or smuggle the request, and
--   idempotency-key, which the relay sets itself;
-- - a payload longer than settings.max_payload as JSON text.
-- SQLSTATE 22023 (invalid_parameter_value) for a malformed argument, 54000
-- (program_limit_exceeded) for one over a limit. src/outbox/enqueue.rs
-- checks the same things in the same order with the same messages.
CREATE OR REPLACE FUNCTION idemgate.enqueue(
    destination  text,
    operation    text,
    business_key text,
    payload      jsonb,
    ordering_key text  DEFAULT NULL,
    headers      jsonb DEFAULT '{}'
) RETURNS text LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    derived      text;
    seq          bigint;
    new_id       bigint;
    outbox_name  text;
    cap          bigint;
    size         bigint;
    header_bytes bigint := 0;
    h            record;
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
    IF jsonb_typeof(coalesce(enqueue.headers, '{}')) <> 'object' THEN
        RAISE EXCEPTION 'enqueue: headers must be a JSON object of strings'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Most messages carry no headers: skip the query (µs per enqueue).
    IF enqueue.headers IS NOT NULL AND enqueue.headers <> '{}' THEN
        FOR h IN SELECT e.key, e.value FROM jsonb_each(enqueue.headers) e ORDER BY e.key COLLATE "C"
        LOOP
            IF h.key !~ '^[!#$%&''*+.^_`|~0-9A-Za-z-]+$' THEN
                RAISE EXCEPTION 'enqueue: headers: "%" is not a valid header name', h.key
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF lower(h.key) IN ('content-length', 'transfer-encoding', 'host', 'connection', 'keep-alive', 'te',
                                'trailer', 'upgrade', 'proxy-authorization', 'proxy-connection', 'idempotency-key') THEN
                RAISE EXCEPTION 'enqueue: headers: "%" is set by the relay or the connection, not per message', h.key
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF jsonb_typeof(h.value) <> 'string' OR (h.value #>> '{}') !~ '^[\t\x20-\x7e]*$' THEN
                RAISE EXCEPTION 'enqueue: headers: the value of "%" must be a string of printable ASCII', h.key
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            header_bytes := header_bytes + octet_length(h.key) + octet_length(h.value #>> '{}');
        END LOOP;
    END IF;
    IF header_bytes > 8192 THEN
        RAISE EXCEPTION 'enqueue: headers are % bytes, more than 8192', header_bytes
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    SELECT s.outbox, s.max_payload INTO outbox_name, cap FROM idemgate.settings s;
    size := octet_length(enqueue.payload::text);
    IF size > cap THEN
        RAISE EXCEPTION 'enqueue: payload is % bytes, more than max_payload (% bytes)', size, cap
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    derived := idemgate.derived_key(outbox_name, enqueue.destination, enqueue.operation, enqueue.business_key);

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
                                 ordering_key, ordering_seq)
    VALUES (derived, enqueue.destination, enqueue.operation, enqueue.business_key, enqueue.payload,
            coalesce(enqueue.headers, '{}'), enqueue.ordering_key, seq)
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
