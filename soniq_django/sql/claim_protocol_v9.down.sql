-- Reverse of claim_protocol_v9.sql: drops what version 9 added. Migration
-- 0019 then puts version 8's soniq_claim_many back (claim_protocol_v8.sql),
-- which calls soniq_reap_lapsed_v2, left in place by version 9.
DROP FUNCTION {schema}.soniq_reap_lapsed_v3(integer, double precision, timestamptz);
