-- A drained server takes no new job and moves its guests elsewhere; owner jobs finish.
ALTER TABLE nodes ADD COLUMN draining BOOLEAN NOT NULL DEFAULT 0;
