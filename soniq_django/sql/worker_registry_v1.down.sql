-- Reverse of worker_registry_v1.sql.
DROP FUNCTION {schema}.soniq_claim_outcome(text, text, bigint, text);
DROP FUNCTION {schema}.soniq_worker_heartbeat(uuid, text);
DROP FUNCTION {schema}.soniq_register_worker(uuid, text[], text[], text, integer, text, integer[], integer);
