ALTER TABLE checkpoints DROP COLUMN write_ms;
