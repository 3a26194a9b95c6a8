ALTER TABLE nodes DROP COLUMN disk_low;
ALTER TABLE nodes DROP COLUMN max_job_disk_gb;
ALTER TABLE jobs DROP COLUMN disk_gb;
