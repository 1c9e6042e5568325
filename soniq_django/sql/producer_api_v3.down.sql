-- Reverse of producer_api_v3.sql: nothing to drop (version 3 adds no
-- function). Migration 0011 puts version 2's soniq_enqueue and
-- soniq_enqueue_many back, read from producer_api_v2.sql itself (same
-- signatures, so grants on them are kept).
SELECT 1;
