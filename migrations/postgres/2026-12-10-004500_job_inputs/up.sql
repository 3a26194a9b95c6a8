-- A job's inputs (issue 28): files and folders of its owner's or a lab's file space,
-- staged under /inputs before its container starts, as a JSON list of what the user
-- wrote (["data/train.tar", "lab:vision/code/"]).
ALTER TABLE jobs ADD COLUMN inputs TEXT NOT NULL DEFAULT '[]';
-- How far each attempt's staging got, as its agent reports it: shown while the attempt
-- starts; finished once its container may start.
CREATE TABLE job_staging (
    job_id BIGINT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    done_bytes BIGINT NOT NULL,
    total_bytes BIGINT NOT NULL,
    finished BOOLEAN NOT NULL DEFAULT FALSE,
    started_at TIMESTAMP NOT NULL,
    updated_at TIMESTAMP NOT NULL,
    PRIMARY KEY (job_id, attempt)
);
