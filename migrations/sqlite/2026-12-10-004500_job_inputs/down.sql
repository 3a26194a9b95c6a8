DROP TABLE job_staging;
ALTER TABLE jobs DROP COLUMN inputs;
