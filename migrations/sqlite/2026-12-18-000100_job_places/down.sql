DROP TRIGGER job_places_leave;
ALTER TABLE jobs ADD COLUMN queue_position INTEGER;
ALTER TABLE jobs ADD COLUMN estimated_start_at TIMESTAMP;
UPDATE jobs SET
    queue_position = (SELECT queue_position FROM job_places WHERE job_id = jobs.id),
    estimated_start_at = (SELECT estimated_start_at FROM job_places WHERE job_id = jobs.id)
    WHERE state = 'queued';
DROP TABLE job_places;
