-- Reverse of producer_api_v1.sql: drop the producer API functions.
DROP FUNCTION {schema}.soniq_get_job(uuid);
DROP FUNCTION {schema}.soniq_enqueue(text, jsonb, text, integer, timestamptz, integer, boolean, text, text, uuid);
DROP FUNCTION {schema}.soniq_args_hash(jsonb);
DROP FUNCTION {schema}.soniq_canonical_json_v1(jsonb);
DROP FUNCTION {schema}.soniq_json_string_v1(text);
DROP FUNCTION {schema}.soniq_check_args_v1(jsonb);
DROP FUNCTION {schema}.soniq_task_name_pattern_v1();
