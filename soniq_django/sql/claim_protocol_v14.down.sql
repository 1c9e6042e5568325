-- Reverse of claim_protocol_v14.sql: its new function. Migration 0034 then puts
-- back version 13's soniq_claim_many, read from claim_protocol_v13.sql (same
-- signature, so its grants are kept; its CREATE carries version 11's settings).
DROP FUNCTION {schema}.soniq_settle_lapsed(double precision);
