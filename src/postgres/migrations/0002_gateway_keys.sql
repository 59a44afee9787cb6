-- The gateway's key store on Postgres (src/store/postgres.rs).
-- A record is one row; expires_at is the lease while in flight (state 'i')
-- and the retention once completed (state 'c'). An expired row counts as
-- absent and is deleted by the store's periodic cleanup.
CREATE TABLE idemgate.gateway_keys (
    key         bytea       PRIMARY KEY,
    fingerprint bytea       NOT NULL,
    state       "char"      NOT NULL CHECK (state IN ('i', 'c')),
    fence       bigint      NOT NULL,
    response    bytea,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX gateway_keys_expiry ON idemgate.gateway_keys (expires_at);
