-- Reverse of producer_api_v2.sql: drop soniq_enqueue_many. Migration 0010
-- then puts version 1's soniq_enqueue back, read from producer_api_v1.sql
-- itself (same signature, so grants on it are kept).
DROP FUNCTION {schema}.soniq_enqueue_many(jsonb);
