-- Jobs that wait for other jobs (issue 30): the waits as a JSON list
-- ([{"job": 41, "when": "ok"}]), and whether the job is held out of the scheduler's queue
-- until they are met. Only held jobs are read each round, through the partial index.
ALTER TABLE jobs ADD COLUMN after_jobs TEXT NOT NULL DEFAULT '[]';
ALTER TABLE jobs ADD COLUMN held BOOLEAN NOT NULL DEFAULT FALSE;
CREATE INDEX jobs_held ON jobs (id) WHERE held;
