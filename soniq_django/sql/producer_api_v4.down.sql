-- Reverse of producer_api_v4.sql: nothing to drop (version 4 adds no
-- function). Migration 0017 puts version 3's soniq_enqueue back, read from
-- producer_api_v3.sql itself (same signature, so grants on it are kept).
SELECT 1;
