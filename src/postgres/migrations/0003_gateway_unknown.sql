-- A gateway record may also be 'u': the request was written to the
-- upstream and its outcome was lost, so the key is held (DESIGN "When
-- nobody knows whether the upstream acted").
ALTER TABLE idemgate.gateway_keys DROP CONSTRAINT gateway_keys_state_check;
ALTER TABLE idemgate.gateway_keys ADD CONSTRAINT gateway_keys_state_check CHECK (state IN ('i', 'c', 'u'));
