-- Reverse of producer_api_v6.sql: the one function it adds.
DROP FUNCTION {schema}.soniq_enqueue_after_many(jsonb, double precision);
