ALTER TABLE jobs DROP COLUMN checkpoint_interval_s;
