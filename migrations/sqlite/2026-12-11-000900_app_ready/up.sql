-- A job's app answered on its port during this attempt: the portal probes it through the
-- job's agent (inside the container's network) and shows the app's URL only from then.
-- A new attempt (after a preemption) is probed again.
CREATE TABLE app_ready (
    job_id BIGINT PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    at TIMESTAMP NOT NULL
);
