-- How long the checkpoint took to write, in milliseconds (from the start of packing its
-- archive to its last part uploaded), as its agent measured it; NULL when the agent did
-- not say (older agents, or an upload resumed from an earlier try's archive). The
-- scheduler's longer grace for slow savers reads it.
ALTER TABLE checkpoints ADD COLUMN write_ms BIGINT;
