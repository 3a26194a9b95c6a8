-- /dev/shm of a job's container, in MiB; NULL: the agent's default (64 MiB).
ALTER TABLE jobs ADD COLUMN shm_mb BIGINT;
