-- Lab datasets (issue 28): large read-only data a lab's admins register once and jobs
-- mount under /datasets/NAME. `source` is what they wrote (lab:PREFIX,
-- https://...#sha256=HEX, node:NAME); `visibility` is 'lab', 'campus' or a JSON list
-- of the lab slugs that may use it besides the lab itself.
CREATE TABLE datasets (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    lab_id BIGINT NOT NULL REFERENCES labs(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    source TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    visibility TEXT NOT NULL,
    created_by TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL,
    UNIQUE (lab_id, name)
);
-- The datasets a job mounts, as a JSON list of {lab, name, mount}.
ALTER TABLE jobs ADD COLUMN datasets TEXT NOT NULL DEFAULT '[]';
-- What each server last said it offers: exported datasets and its dataset cache (the
-- agent's NodeDatasets as JSON; '{}' until an agent of protocol 5 reports).
ALTER TABLE nodes ADD COLUMN datasets TEXT NOT NULL DEFAULT '{}';
