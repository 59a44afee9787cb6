-- The outbox's own name in every derived key, so two outboxes (two schemas
-- in one database) never hand one destination the same key.
-- Runs inside the migrator's transaction.

-- One row of settings. `outbox` is the name every derived key starts
-- with: the schema's name when this migration ran, kept even if the schema
-- is renamed later, so waiting rows and the delivered history keep their
-- keys.
CREATE TABLE idemgate.settings (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    outbox   text    NOT NULL
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

-- As in migration 1, but the key names the outbox.
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
    derived text;
    seq    bigint;
    new_id bigint;
BEGIN
    IF enqueue.destination IS NULL OR enqueue.operation IS NULL OR enqueue.business_key IS NULL
       OR enqueue.payload IS NULL THEN
        RAISE EXCEPTION 'idemgate.enqueue: destination, operation, business_key and payload are required'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF jsonb_typeof(coalesce(enqueue.headers, '{}')) <> 'object' THEN
        RAISE EXCEPTION 'idemgate.enqueue: headers must be a JSON object of strings'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT idemgate.derived_key(s.outbox, enqueue.destination, enqueue.operation, enqueue.business_key)
      INTO derived FROM idemgate.settings s;

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
