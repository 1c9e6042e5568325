-- Reverse of claim_protocol_v6.sql. Nothing to drop: version 6 only replaced
-- soniq_claim_many's body. Migration 0014 puts version 5's body back, read from
-- claim_protocol_v5.sql itself (same signature, so grants on it are kept), and
-- restores the index soniq_jobs_claim_any_idx in place of the three it added.
SELECT 1;
