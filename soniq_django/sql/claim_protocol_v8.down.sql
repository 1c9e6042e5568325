-- Reverse of claim_protocol_v8.sql: drops what version 8 added. Migration
-- 0018 then puts back the released bodies of what it replaced.
SELECT 1;
-- The slots held by handlers that run on (helper `holds`): dropped. soniq_defer
-- gets version 4's body back from the migration (claim_protocol_v4.sql).
DROP FUNCTION {schema}.soniq_renew_holds(text, text[], bigint[], double precision);
DROP FUNCTION {schema}.soniq_release_hold(text, text, bigint);
DROP FUNCTION {schema}.soniq_hold_slot(text, text, bigint, text, text, double precision);
