-- Reverse of claim_protocol_v2.sql.
DROP FUNCTION {schema}.soniq_claim_many(text, text[], text[], double precision, double precision, integer);
