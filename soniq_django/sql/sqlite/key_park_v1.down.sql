-- Reverse of key_park_v1.sql (SQLite): its triggers.
DROP TRIGGER soniq_key_released;
DROP TRIGGER soniq_key_dead_letter;
