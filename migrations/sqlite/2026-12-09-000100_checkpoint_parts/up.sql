-- Checkpoint parts uploaded and not yet committed, one row per part number of an upload
-- (the `seq`-th commit of attempt `attempt` of job `job_id`). A row is written, in the
-- transaction that checked the caps with the lab's row locked, before the part's object
-- is stored: a lab's use is its committed checkpoints plus these. A commit turns its
-- rows into a `checkpoints` row; the parts of an attempt no longer placed are removed.
CREATE TABLE checkpoint_parts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id BIGINT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    n INTEGER NOT NULL,
    lab_id BIGINT NOT NULL REFERENCES labs(id),
    bytes BIGINT NOT NULL,
    sha256 TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL,
    UNIQUE (job_id, attempt, seq, n)
);
CREATE INDEX checkpoint_parts_lab ON checkpoint_parts (lab_id);
