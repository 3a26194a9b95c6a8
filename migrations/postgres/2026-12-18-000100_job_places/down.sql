DROP TRIGGER job_places_leave ON jobs;
DROP FUNCTION job_places_leave();
ALTER TABLE jobs ADD COLUMN queue_position INTEGER, ADD COLUMN estimated_start_at TIMESTAMP;
UPDATE jobs SET queue_position = p.queue_position, estimated_start_at = p.estimated_start_at
    FROM job_places p WHERE p.job_id = jobs.id AND jobs.state = 'queued';
DROP TABLE job_places;
