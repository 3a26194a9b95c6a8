-- About-to-end notices (issue 30): one row per job, attempt and reason ("time limit",
-- "idle") once its `ending` notification was queued, so it is queued once per attempt
-- whichever pass or replica sees the job near its end first.
CREATE TABLE job_notices (
    job_id BIGINT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    reason TEXT NOT NULL,
    -- When the job will end, as the notice said.
    ends_at TIMESTAMP NOT NULL,
    created_at TIMESTAMP NOT NULL,
    PRIMARY KEY (job_id, attempt, reason)
);
