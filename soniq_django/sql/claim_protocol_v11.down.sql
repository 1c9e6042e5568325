-- Reverse of claim_protocol_v11.sql. Nothing to drop: version 11 only replaced
-- the body of soniq_complete_many. Migration 0023 puts version 8's body back,
-- read from claim_protocol_v8.sql (same signature, so grants on it are kept).
SELECT 1;
