ALTER TABLE nodes DROP COLUMN share_mode;
ALTER TABLE job_attempts DROP COLUMN gpu_memory_used_mb;
ALTER TABLE job_attempts DROP COLUMN share_memory_mb;
ALTER TABLE job_attempts DROP COLUMN share_milli;
ALTER TABLE jobs DROP COLUMN gpu_share_memory_mb;
ALTER TABLE jobs DROP COLUMN gpu_milli;
