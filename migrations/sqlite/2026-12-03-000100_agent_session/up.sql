-- Leases count from the agent's own messages: the last (session, seq) the portal received
-- from each node, and when (portal time), so any replica can grant a lease in a Start.
ALTER TABLE nodes ADD COLUMN agent_session BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN agent_seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN agent_seq_at TIMESTAMP;
