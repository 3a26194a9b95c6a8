-- A lab's interactive jobs go ahead of its batch jobs (set by the lab's admins).
ALTER TABLE labs ADD COLUMN interactive_boost BOOLEAN NOT NULL DEFAULT FALSE;
