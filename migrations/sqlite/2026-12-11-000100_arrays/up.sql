-- Job arrays (issue 30): one request that made many tasks, each a job of its own with its
-- index. The throttle (at most this many tasks start or run at once) is kept here and
-- applied where the scheduler's snapshot is read.
CREATE TABLE arrays (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id BIGINT NOT NULL REFERENCES users(id),
    lab_id BIGINT NOT NULL REFERENCES labs(id),
    spec TEXT NOT NULL,
    task_count BIGINT NOT NULL,
    throttle BIGINT,
    name TEXT,
    created_at TIMESTAMP NOT NULL,
    -- The job id of its first task (the job list shows the array in its place).
    first_job BIGINT
);
ALTER TABLE jobs ADD COLUMN array_id BIGINT REFERENCES arrays(id);
ALTER TABLE jobs ADD COLUMN array_index BIGINT;
CREATE INDEX jobs_array ON jobs (array_id, array_index) WHERE array_id IS NOT NULL;
