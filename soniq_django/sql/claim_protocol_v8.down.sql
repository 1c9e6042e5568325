-- Reverse of claim_protocol_v8.sql: drops what version 8 added. Migration
-- 0018 then puts back the released bodies of what it replaced.
SELECT 1;
