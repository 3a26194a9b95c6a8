-- A waiting job's place in the queue and its estimated start move out of the wide `jobs`
-- rows into a narrow table (PostgreSQL's is unlogged; see its migration). A job that
-- leaves the queue, or comes back to it, loses its row (trigger below).
CREATE TABLE job_places (
    job_id BIGINT PRIMARY KEY NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    queue_position INTEGER,
    estimated_start_at TIMESTAMP
);
INSERT INTO job_places (job_id, queue_position, estimated_start_at)
    SELECT id, queue_position, estimated_start_at FROM jobs
    WHERE state = 'queued' AND (queue_position IS NOT NULL OR estimated_start_at IS NOT NULL);
ALTER TABLE jobs DROP COLUMN queue_position;
ALTER TABLE jobs DROP COLUMN estimated_start_at;
CREATE TRIGGER job_places_leave AFTER UPDATE OF state ON jobs
    WHEN OLD.state <> NEW.state AND (OLD.state = 'queued' OR NEW.state = 'queued')
BEGIN
    DELETE FROM job_places WHERE job_id = NEW.id;
END;
