-- Job names and tags (issue 30): a name for people to find a job by, and up to 16
-- key=value tags as a JSON object ({"lr": "0.1"}), which the job list filters on.
ALTER TABLE jobs ADD COLUMN name TEXT;
ALTER TABLE jobs ADD COLUMN tags TEXT NOT NULL DEFAULT '{}';
CREATE INDEX jobs_user_name ON jobs (user_id, name);
