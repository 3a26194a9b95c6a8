-- The fence without gaps (issue 26).
-- Where the agent that holds the node's credential connects from; a second agent with the
-- same credential, refused while the first lives (pending until the first proves alive
-- again); and the flag raised then (both addresses), for the node's page and the API.
ALTER TABLE nodes ADD COLUMN agent_addr TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN contender_session BIGINT;
ALTER TABLE nodes ADD COLUMN contender_addr TEXT;
ALTER TABLE nodes ADD COLUMN contender_at TIMESTAMP;
ALTER TABLE nodes ADD COLUMN shared_at TIMESTAMP;
ALTER TABLE nodes ADD COLUMN shared_connected_from TEXT;
ALTER TABLE nodes ADD COLUMN shared_refused_from TEXT;
-- The GPU models and counts the node first reported (JSON {"model": count}), and whether
-- it now reports more, or other models, than that: then no guest is placed there until
-- its lab admin approves the new inventory.
ALTER TABLE nodes ADD COLUMN gpu_baseline TEXT;
ALTER TABLE nodes ADD COLUMN inventory_unapproved BOOLEAN NOT NULL DEFAULT FALSE;
