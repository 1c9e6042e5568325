-- Reverse of claim_protocol_v1.sql.
DROP TRIGGER soniq_protect_owned ON {schema}.soniq_jobs;
DROP FUNCTION {schema}.soniq_request_cancel(uuid, double precision);
DROP FUNCTION {schema}.soniq_acknowledge_cancel(text, text, bigint, text, text, double precision);
DROP FUNCTION {schema}.soniq_get_state(text, text, bigint, text, text);
DROP FUNCTION {schema}.soniq_set_pid(text, text, bigint, text, text, integer);
DROP FUNCTION {schema}.soniq_fail(text, text, bigint, text, text, text, boolean, double precision, text, text, integer, double precision, double precision);
DROP FUNCTION {schema}.soniq_complete(text, text, bigint, text, text, jsonb, double precision);
DROP FUNCTION {schema}.soniq_heartbeat(text, text, bigint, text, text, double precision);
DROP FUNCTION {schema}.soniq_lock_fence_v1(text, text, bigint, text, text);
DROP FUNCTION {schema}.soniq_recover_claim(text, text);
DROP FUNCTION {schema}.soniq_claim(text, text, text[], double precision, double precision, integer);
DROP FUNCTION {schema}.soniq_reap_lapsed_v1(integer, double precision);
DROP FUNCTION {schema}.soniq_move_to_dead_letter_v1(uuid, text, text, text);
DROP FUNCTION {schema}.soniq_protect_owned_v1();
DROP FUNCTION {schema}.soniq_fenced_write_v1(boolean);
DROP FUNCTION {schema}.soniq_check_seconds_v1(double precision, text, boolean);
DROP FUNCTION {schema}.soniq_check_identity_v1(text, text);
