-- The tenant of each gateway record (16 bytes of the tenant's hash, as the
-- store receives it), so that tenant_quota can count a tenant's live rows
-- (src/store/postgres.rs). Rows written before this migration have none
-- and are never counted; they expire within key_ttl.
ALTER TABLE idemgate.gateway_keys ADD COLUMN tenant bytea;
CREATE INDEX gateway_keys_tenant ON idemgate.gateway_keys (tenant, expires_at) WHERE tenant IS NOT NULL;
