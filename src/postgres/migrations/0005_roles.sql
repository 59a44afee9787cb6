-- Who may do what. Before this migration enqueue ran with the caller's
-- privileges, so a service role needed INSERT and DELETE on the outbox
-- (DELETE for a re-enqueue of a delivered key) and could then read or
-- delete every row; retention created and dropped partitions, which only
-- the owner may. Now the functions that need the owner's rights run with
-- them (SECURITY DEFINER, owned by the migrating role), with a pinned
-- search_path so a caller's objects cannot stand in for ours (every name
-- in them is schema-qualified or in pg_catalog), and nobody may call them
-- until granted: `idemgate migrate --grant-service ROLE --grant-relay ROLE`
-- (src/outbox/roles.rs) grants the two roles exactly what they need.

ALTER FUNCTION idemgate.enqueue(text, text, text, jsonb, text, jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- As in migration 1, with the owner's rights (a relay role that does not
-- own the schema can run it) and a floor on `retention`: whoever may call
-- it must not be able to empty the history, which would let delivered
-- keys be enqueued (and delivered) again.
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
    -- A sequence row may go once its key has no row waiting. The updated_at
    -- test is rechecked on the newest row version, so a row an enqueuer is
    -- using right now is never deleted under it.
    DELETE FROM idemgate.ordering_keys s
     WHERE s.updated_at < clock_timestamp() - interval '1 day'
       AND NOT EXISTS (SELECT 1 FROM idemgate.outbox o WHERE o.ordering_key = s.ordering_key);
END
$$;

-- Functions are executable by PUBLIC unless revoked. redrive keeps the
-- caller's rights (it needs UPDATE on the outbox, which the relay role has).
REVOKE EXECUTE ON FUNCTION idemgate.enqueue(text, text, text, jsonb, text, jsonb),
                           idemgate.maintain_history(interval),
                           idemgate.redrive(bigint) FROM PUBLIC;

-- An upgrade takes nothing away that worked: every role that could use the
-- schema could call enqueue and redrive through PUBLIC, and keeps them.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT a.oid::regrole AS role FROM pg_roles a, pg_namespace n
         WHERE n.oid = (SELECT relnamespace FROM pg_class WHERE oid = 'idemgate.outbox'::regclass)
           AND a.oid <> n.nspowner AND NOT a.rolsuper AND a.rolname !~ '^pg_'
           AND has_schema_privilege(a.oid, n.oid, 'USAGE')
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION idemgate.enqueue(text, text, text, jsonb, text, jsonb), '
                       'idemgate.redrive(bigint) TO %s', r.role);
    END LOOP;
END
$$;
