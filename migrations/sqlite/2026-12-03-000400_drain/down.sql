ALTER TABLE nodes DROP COLUMN draining;
