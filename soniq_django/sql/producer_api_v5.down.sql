-- Reverse of producer_api_v5.sql: the one function it adds.
DROP FUNCTION {schema}.soniq_enqueue_after(uuid[], text, jsonb, text, integer, timestamptz,
    integer, boolean, text, text, uuid, boolean, double precision);
