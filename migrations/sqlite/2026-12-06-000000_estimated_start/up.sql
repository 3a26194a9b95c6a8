-- When the scheduler expects a waiting job to start (its latest plan); NULL: unknown.
ALTER TABLE jobs ADD COLUMN estimated_start_at TIMESTAMP;
