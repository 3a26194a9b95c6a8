-- GPU utilisation of running attempts over time, from the agents' heartbeats: at most one
-- row per attempt per sample interval (`[utilization] sample_interval_s`), holding the
-- mean utilisation of the attempt's GPUs over that interval and the most memory they used
-- together. Rows older than `[utilization] retention_days` are deleted; deleted with
-- their job.
CREATE TABLE attempt_samples (
    id BIGSERIAL PRIMARY KEY,
    job_id BIGINT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    at TIMESTAMP NOT NULL,
    utilization_pct DOUBLE PRECISION NOT NULL,
    memory_used_mb BIGINT NOT NULL
);
CREATE INDEX attempt_samples_job ON attempt_samples (job_id, attempt, at);
CREATE INDEX attempt_samples_at ON attempt_samples (at);
