-- The transactional outbox: the queue, the per-ordering-key sequence, the
-- delivered history partitioned by day, and the enqueue function.
-- Runs inside the migrator's transaction, after CREATE SCHEMA idemgate.

-- The hot table: rows waiting, leased or dead. Delivered rows move to
-- idemgate.delivered in the statement that marks them done, so this table
-- stays as small as the backlog.
CREATE TABLE idemgate.outbox (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    derived_key         text        NOT NULL UNIQUE,
    destination         text        NOT NULL,
    operation           text        NOT NULL,
    business_key        text        NOT NULL,
    payload             jsonb       NOT NULL,
    headers             jsonb       NOT NULL DEFAULT '{}',
    ordering_key        text,
    ordering_seq        bigint,
    state               text        NOT NULL DEFAULT 'ready' CHECK (state IN ('ready', 'leased', 'dead')),
    -- Incremented by every claim; the fence token of the claim.
    attempts            integer     NOT NULL DEFAULT 0,
    -- attempts as it was at the last redrive: the retry policy counts from here.
    attempts_at_redrive integer     NOT NULL DEFAULT 0,
    available_at        timestamptz NOT NULL DEFAULT now(),
    lease_until         timestamptz,
    last_error          text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    dead_at             timestamptz,
    CHECK ((ordering_key IS NULL) = (ordering_seq IS NULL))
);

-- The claim scans ready rows by due time.
CREATE INDEX outbox_ready ON idemgate.outbox (available_at, id) WHERE state = 'ready';
-- The reaper finds expired leases.
CREATE INDEX outbox_leased ON idemgate.outbox (lease_until) WHERE state = 'leased';
-- "Is there an earlier row of my ordering key?" is one index probe.
CREATE UNIQUE INDEX outbox_ordering ON idemgate.outbox (ordering_key, ordering_seq) WHERE ordering_key IS NOT NULL;
CREATE INDEX outbox_dead ON idemgate.outbox (dead_at, id) WHERE state = 'dead';

-- One row per ordering key: the last sequence number handed out. enqueue()
-- updates it with a row lock held to the end of the caller's transaction,
-- so two enqueuers of one key are serialised and sequence order is commit
-- order. updated_at lets the cleanup skip rows an enqueuer just touched.
CREATE TABLE idemgate.ordering_keys (
    ordering_key text        PRIMARY KEY,
    last_seq     bigint      NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Delivered rows, one partition per UTC day, dropped whole by retention
-- (idemgate.maintain_history), so history is never vacuumed row by row.
-- The payload is not kept: the history answers "was this key delivered,
-- when, after how many attempts", and blocks re-enqueueing the key.
CREATE TABLE idemgate.delivered (
    id           bigint      NOT NULL,
    derived_key  text        NOT NULL,
    destination  text        NOT NULL,
    operation    text        NOT NULL,
    business_key text        NOT NULL,
    ordering_key text,
    ordering_seq bigint,
    attempts     integer     NOT NULL,
    enqueued_at  timestamptz NOT NULL,
    delivered_at timestamptz NOT NULL
) PARTITION BY RANGE (delivered_at);
CREATE TABLE idemgate.delivered_default PARTITION OF idemgate.delivered DEFAULT;
CREATE INDEX delivered_key ON idemgate.delivered (derived_key);

-- hex(sha256(destination ‖ operation ‖ business_key)), each field written as
-- its UTF-8 length (8 bytes, big endian: int8send) and then its bytes: the
-- encoding of src/idempotency/hash.rs, byte for byte.
CREATE FUNCTION idemgate.derived_key(destination text, operation text, business_key text)
RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT encode(sha256(
        int8send(octet_length(convert_to($1, 'UTF8'))::int8) || convert_to($1, 'UTF8') ||
        int8send(octet_length(convert_to($2, 'UTF8'))::int8) || convert_to($2, 'UTF8') ||
        int8send(octet_length(convert_to($3, 'UTF8'))::int8) || convert_to($3, 'UTF8')), 'hex')
$$;

-- Call inside the service's own transaction. Returns the derived key; a key
-- already waiting, dead, or delivered within the history retention is a
-- no-op. Rows with an ordering_key are delivered in commit order per key.
CREATE FUNCTION idemgate.enqueue(
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
    derived := idemgate.derived_key(enqueue.destination, enqueue.operation, enqueue.business_key);

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

-- Dead rows back to the queue: one (by id) or all (NULL). Returns how many.
CREATE FUNCTION idemgate.redrive(row_id bigint DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE n bigint;
BEGIN
    UPDATE idemgate.outbox
       SET state = 'ready', attempts_at_redrive = attempts, available_at = now(),
           last_error = NULL, dead_at = NULL
     WHERE state = 'dead' AND (row_id IS NULL OR id = row_id);
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM pg_notify('idemgate_outbox', '');
    END IF;
    RETURN n;
END
$$;

-- Retention: day partitions for today and the next two days, partitions
-- (and default-partition rows) older than `retention` dropped, sequence
-- rows of idle ordering keys forgotten. Safe to run from several relays
-- at once: only the holder of a transaction-level advisory lock works.
CREATE FUNCTION idemgate.maintain_history(retention interval)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    day   date;
    part  record;
    upper_bound timestamptz;
BEGIN
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
    -- A sequence row may go once its key has no row waiting. The updated_at
    -- test is rechecked on the newest row version, so a row an enqueuer is
    -- using right now is never deleted under it.
    DELETE FROM idemgate.ordering_keys s
     WHERE s.updated_at < clock_timestamp() - interval '1 day'
       AND NOT EXISTS (SELECT 1 FROM idemgate.outbox o WHERE o.ordering_key = s.ordering_key);
END
$$;

SELECT idemgate.maintain_history(interval '7 days');
