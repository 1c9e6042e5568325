-- Reverse of claim_protocol_v7.sql. Nothing to drop: version 7 only replaced
-- the bodies of soniq_claim_many and soniq_complete_many. Migration 0016 puts
-- version 6's soniq_claim_many back, read from claim_protocol_v6.sql, and
-- version 2's soniq_complete_many, read from claim_protocol_v2.sql (same
-- signatures, so grants on them are kept).
SELECT 1;
