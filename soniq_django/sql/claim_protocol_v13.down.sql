-- Reverse of claim_protocol_v13.sql, first part: its two new functions. Migration
-- 0031 then puts back the released bodies it replaced (soniq_claim_many from
-- claim_protocol_v10.sql, soniq_complete_many from claim_protocol_v11.sql,
-- soniq_hold_slot from claim_protocol_v8.sql, soniq_key_sweep from
-- claim_protocol_v12.sql; same signatures, so their grants are kept), and
-- last claim_protocol_v13.settings.down.sql.
DROP FUNCTION {schema}.soniq_queue_budget_v3(text, integer);
DROP FUNCTION {schema}.soniq_key_lock_v1(text[], text[]);
