-- Reverse of claim_protocol_v8.sql: drops what version 8 added. Migration
-- 0018 then puts back the released bodies of what it replaced.
--
-- The claim's part: soniq_queue_budget_v2 and soniq_reap_lapsed_v2 are
-- dropped (version 7's soniq_claim_many, put back from claim_protocol_v7.sql,
-- calls the v1 helpers, which version 8 left in place); soniq_claim_many and
-- soniq_complete_many get version 7's bodies back from claim_protocol_v7.sql
-- (same signatures, so grants on them are kept). The migration then drops
-- the index soniq_jobs_claim_queue_now_idx.
DROP FUNCTION {schema}.soniq_queue_budget_v2(text, integer);
DROP FUNCTION {schema}.soniq_reap_lapsed_v2(integer, double precision);
SELECT 1;
-- The slots held by handlers that run on (helper `holds`): dropped. soniq_defer
-- gets version 4's body back from the migration (claim_protocol_v4.sql).
DROP FUNCTION {schema}.soniq_renew_holds(text, text[], bigint[], double precision);
DROP FUNCTION {schema}.soniq_release_hold(text, text, bigint);
DROP FUNCTION {schema}.soniq_hold_slot(text, text, bigint, text, text, double precision);
