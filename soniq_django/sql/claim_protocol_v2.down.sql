-- Reverse of claim_protocol_v2.sql: drop soniq_claim_many and
-- soniq_complete_many. Migration 0009 then puts version 1's soniq_complete
-- back, read from claim_protocol_v1.sql itself (same signature, so grants on
-- it are kept).
DROP FUNCTION {schema}.soniq_claim_many(text, text[], text[], double precision, double precision, integer);
DROP FUNCTION {schema}.soniq_complete_many(text[], text, bigint[], text[], text[], jsonb[], double precision);
