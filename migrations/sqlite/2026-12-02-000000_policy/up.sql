-- Scheduling policy data: lending rules per node, quotas per lab and member, GPU idle time.
-- JSON columns hold the serde form of commons_sched::{Lending, Quota}; '{}' means the
-- defaults (lend always, no limits).
ALTER TABLE nodes ADD COLUMN lending TEXT NOT NULL DEFAULT '{}';
ALTER TABLE nodes ADD COLUMN grace_s INTEGER NOT NULL DEFAULT 300;
ALTER TABLE nodes ADD COLUMN reclaim BOOLEAN NOT NULL DEFAULT 0;
ALTER TABLE gpus ADD COLUMN idle_since TIMESTAMP;
ALTER TABLE labs ADD COLUMN quota TEXT NOT NULL DEFAULT '{}';
ALTER TABLE memberships ADD COLUMN quota TEXT NOT NULL DEFAULT '{}';
