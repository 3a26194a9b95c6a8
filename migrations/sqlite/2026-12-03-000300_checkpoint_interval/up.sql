-- A job may ask the agent to snapshot /checkpoint every N seconds while it runs.
ALTER TABLE jobs ADD COLUMN checkpoint_interval_s BIGINT;
