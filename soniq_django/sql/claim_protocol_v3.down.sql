-- Reverse of claim_protocol_v3.sql: drop the two helpers it added. Migration
-- 0011 then puts version 1's soniq_reap_lapsed_v1, soniq_move_to_dead_letter_v1,
-- soniq_fail, soniq_request_cancel and soniq_claim back, read from claim_protocol_v1.sql
-- itself (same signatures, so grants on them are kept).
DROP FUNCTION {schema}.soniq_requeue_v1(uuid, text, timestamptz, timestamptz, double precision);
DROP FUNCTION {schema}.soniq_default_max_attempts_v1(text);
