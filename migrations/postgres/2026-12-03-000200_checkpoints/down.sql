ALTER TABLE labs DROP COLUMN checkpoint_cap_gb;
DROP TABLE checkpoints;
