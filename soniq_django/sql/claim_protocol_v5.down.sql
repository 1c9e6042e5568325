-- Reverse of claim_protocol_v5.sql: drop soniq_queue_budget_v1, the helper it
-- added. Migration 0013 then puts version 2's soniq_claim_many back, read from
-- claim_protocol_v2.sql itself (same signature, so grants on it are kept), and
-- drops the tables soniq_queue_settings and soniq_queue_starts.
DROP FUNCTION {schema}.soniq_queue_budget_v1(text, integer);
