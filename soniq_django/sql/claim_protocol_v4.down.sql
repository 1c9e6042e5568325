-- Reverse of claim_protocol_v4.sql: drop soniq_defer, the one function it
-- added. Nothing else changed, so nothing is restored.
DROP FUNCTION {schema}.soniq_defer(text, text, bigint, text, text, text, double precision, double precision);
