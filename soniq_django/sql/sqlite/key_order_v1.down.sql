-- Reverse of key_order_v1.sql (SQLite): its trigger. Migration 0033 then puts
-- version 12's soniq_key_admit back from claim_protocol_v12.sql.
DROP TRIGGER soniq_key_admit;
