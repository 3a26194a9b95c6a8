ALTER TABLE jobs DROP COLUMN estimated_start_at;
