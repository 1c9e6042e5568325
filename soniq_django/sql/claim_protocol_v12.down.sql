-- Reverse of claim_protocol_v12.sql: its triggers, then its functions. Migration
-- 0029 then drops the tables and soniq_jobs.concurrency_key.
DROP TRIGGER soniq_key_hold_gone ON {schema}.soniq_queue_holds;
DROP TRIGGER soniq_key_deferred ON {schema}.soniq_jobs;
DROP TRIGGER soniq_key_gone ON {schema}.soniq_jobs;
DROP TRIGGER soniq_key_moved ON {schema}.soniq_jobs;
DROP FUNCTION {schema}.soniq_enqueue_keyed(text, integer, text, text, jsonb, text, integer,
                                           timestamptz, integer, boolean, text, text, uuid);
DROP FUNCTION {schema}.soniq_key_refresh(text, text);
DROP FUNCTION {schema}.soniq_key_sweep();
DROP FUNCTION {schema}.soniq_key_hold_gone_v1();
DROP FUNCTION {schema}.soniq_key_deferred_v1();
DROP FUNCTION {schema}.soniq_key_moved_v1();
DROP FUNCTION {schema}.soniq_key_admit_v1(text, text);
DROP FUNCTION {schema}.soniq_key_limit_v1(text, text);
