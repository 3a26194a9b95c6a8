-- Committed checkpoints of jobs' /checkpoint (tar + zstd archives in the object store).
-- A checkpoint is the `seq`-th commit of attempt `attempt`; its objects live under `prefix`
-- (parts and manifest.json). `lab_id` is the job's lab, whose cap the bytes count against.
CREATE TABLE checkpoints (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id BIGINT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    node_id BIGINT NOT NULL REFERENCES nodes(id),
    lab_id BIGINT NOT NULL REFERENCES labs(id),
    prefix TEXT NOT NULL UNIQUE,
    bytes BIGINT NOT NULL,
    sha256 TEXT NOT NULL,
    parts INTEGER NOT NULL,
    created_at TIMESTAMP NOT NULL,
    UNIQUE (job_id, attempt, seq)
);
CREATE INDEX checkpoints_lab ON checkpoints (lab_id);

-- An operator's cap on a lab's checkpoints, in GB; NULL: the campus default.
ALTER TABLE labs ADD COLUMN checkpoint_cap_gb DOUBLE PRECISION;
