-- A job's disk cap in GiB (`disk_gb`: every host path it writes, and its checkpoint);
-- NULL: the campus default ([policy] default_disk_gb) when it is placed and started.
ALTER TABLE jobs ADD COLUMN disk_gb BIGINT;
-- The largest disk_gb the node's agent gives a job (--max-job-disk-gb); NULL: not
-- reported (an older agent), no limit.
ALTER TABLE nodes ADD COLUMN max_job_disk_gb BIGINT;
-- Why the node takes no new guests now (its agent's disk is under its free-space
-- floor), in words; NULL: it takes them.
ALTER TABLE nodes ADD COLUMN disk_low TEXT;
