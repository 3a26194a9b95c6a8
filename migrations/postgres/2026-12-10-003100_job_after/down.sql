DROP INDEX jobs_held;
ALTER TABLE jobs DROP COLUMN held;
ALTER TABLE jobs DROP COLUMN after_jobs;
