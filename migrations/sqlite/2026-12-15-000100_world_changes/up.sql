-- The scheduler's change log (issue 33): every committed change to a row the scheduler's
-- world is made of (a job, an attempt, a node, a GPU, a checkpoint, a lab, a membership, a
-- dataset) leaves (kind, id) here, written by triggers in the same transaction as the
-- change, so no writer can forget it. The leading portal takes the rows out each round
-- (`DELETE ... RETURNING`) and reads again only what they name (`db::world`). Updates
-- that change nothing the scheduler reads (heartbeats, lease renewals, a waiting job's
-- place and estimate, which the scheduler itself writes) leave nothing.
-- kinds: 1 job (id), 2 a job's attempts (job id), 3 node (id), 4 GPU (id),
-- 5 a job's checkpoints (job id), 6 lab (id), 7 membership (lab id), 8 dataset (lab id).
CREATE TABLE world_changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    kind INTEGER NOT NULL,
    id BIGINT NOT NULL
);

CREATE TRIGGER world_jobs_insert AFTER INSERT ON jobs
BEGIN INSERT INTO world_changes (kind, id) VALUES (1, NEW.id); END;
CREATE TRIGGER world_jobs_delete AFTER DELETE ON jobs
BEGIN INSERT INTO world_changes (kind, id) VALUES (1, OLD.id); END;
CREATE TRIGGER world_jobs_update AFTER UPDATE ON jobs
    WHEN OLD.user_id IS NOT NEW.user_id
    OR OLD.lab_id IS NOT NEW.lab_id
    OR OLD.gpus IS NOT NEW.gpus
    OR OLD.gpu_models IS NOT NEW.gpu_models
    OR OLD.min_gpu_memory_mb IS NOT NEW.min_gpu_memory_mb
    OR OLD.cpus IS NOT NEW.cpus
    OR OLD.memory_mb IS NOT NEW.memory_mb
    OR OLD.disk_gb IS NOT NEW.disk_gb
    OR OLD.time_limit_s IS NOT NEW.time_limit_s
    OR OLD.kind IS NOT NEW.kind
    OR OLD.state IS NOT NEW.state
    OR OLD.created_at IS NOT NEW.created_at
    OR OLD.reason IS NOT NEW.reason
    OR OLD.array_id IS NOT NEW.array_id
    OR OLD.held IS NOT NEW.held
    OR OLD.datasets IS NOT NEW.datasets
    OR OLD.inputs IS NOT NEW.inputs
    OR OLD.gpu_milli IS NOT NEW.gpu_milli
    OR OLD.gpu_share_memory_mb IS NOT NEW.gpu_share_memory_mb
BEGIN INSERT INTO world_changes (kind, id) VALUES (1, NEW.id); END;

CREATE TRIGGER world_job_attempts_insert AFTER INSERT ON job_attempts
BEGIN INSERT INTO world_changes (kind, id) VALUES (2, NEW.job_id); END;
CREATE TRIGGER world_job_attempts_delete AFTER DELETE ON job_attempts
BEGIN INSERT INTO world_changes (kind, id) VALUES (2, OLD.job_id); END;
CREATE TRIGGER world_job_attempts_update AFTER UPDATE ON job_attempts
    WHEN OLD.job_id IS NOT NEW.job_id
    OR OLD.attempt IS NOT NEW.attempt
    OR OLD.node_id IS NOT NEW.node_id
    OR OLD.gpu_ids IS NOT NEW.gpu_ids
    OR OLD.state IS NOT NEW.state
    OR OLD.created_at IS NOT NEW.created_at
    OR OLD.started_at IS NOT NEW.started_at
    OR OLD.ended_at IS NOT NEW.ended_at
    OR OLD.share_milli IS NOT NEW.share_milli
    OR OLD.share_memory_mb IS NOT NEW.share_memory_mb
BEGIN INSERT INTO world_changes (kind, id) VALUES (2, NEW.job_id); END;

CREATE TRIGGER world_nodes_insert AFTER INSERT ON nodes
BEGIN INSERT INTO world_changes (kind, id) VALUES (3, NEW.id); END;
CREATE TRIGGER world_nodes_delete AFTER DELETE ON nodes
BEGIN INSERT INTO world_changes (kind, id) VALUES (3, OLD.id); END;
CREATE TRIGGER world_nodes_update AFTER UPDATE ON nodes
    WHEN OLD.lab_id IS NOT NEW.lab_id
    OR OLD.name IS NOT NEW.name
    OR OLD.online IS NOT NEW.online
    OR OLD.revoked_at IS NOT NEW.revoked_at
    OR OLD.lending IS NOT NEW.lending
    OR OLD.grace_s IS NOT NEW.grace_s
    OR OLD.reclaim IS NOT NEW.reclaim
    OR OLD.draining IS NOT NEW.draining
    OR OLD.cpus IS NOT NEW.cpus
    OR OLD.memory_mb IS NOT NEW.memory_mb
    OR OLD.max_job_disk_gb IS NOT NEW.max_job_disk_gb
    OR OLD.disk_low IS NOT NEW.disk_low
    OR OLD.inventory_unapproved IS NOT NEW.inventory_unapproved
    OR OLD.datasets IS NOT NEW.datasets
    OR OLD.share_mode IS NOT NEW.share_mode
BEGIN INSERT INTO world_changes (kind, id) VALUES (3, NEW.id); END;

CREATE TRIGGER world_gpus_insert AFTER INSERT ON gpus
BEGIN INSERT INTO world_changes (kind, id) VALUES (4, NEW.id); END;
CREATE TRIGGER world_gpus_delete AFTER DELETE ON gpus
BEGIN INSERT INTO world_changes (kind, id) VALUES (4, OLD.id); END;
CREATE TRIGGER world_gpus_update AFTER UPDATE ON gpus
    WHEN OLD.node_id IS NOT NEW.node_id
    OR OLD.model IS NOT NEW.model
    OR OLD.memory_mb IS NOT NEW.memory_mb
    OR OLD.present IS NOT NEW.present
    OR OLD.local_use IS NOT NEW.local_use
    OR OLD.idle_since IS NOT NEW.idle_since
    OR OLD.fault IS NOT NEW.fault
BEGIN INSERT INTO world_changes (kind, id) VALUES (4, NEW.id); END;

CREATE TRIGGER world_checkpoints_insert AFTER INSERT ON checkpoints
BEGIN INSERT INTO world_changes (kind, id) VALUES (5, NEW.job_id); END;
CREATE TRIGGER world_checkpoints_delete AFTER DELETE ON checkpoints
BEGIN INSERT INTO world_changes (kind, id) VALUES (5, OLD.job_id); END;
CREATE TRIGGER world_checkpoints_update AFTER UPDATE ON checkpoints
BEGIN INSERT INTO world_changes (kind, id) VALUES (5, NEW.job_id); END;

CREATE TRIGGER world_labs_insert AFTER INSERT ON labs
BEGIN INSERT INTO world_changes (kind, id) VALUES (6, NEW.id); END;
CREATE TRIGGER world_labs_delete AFTER DELETE ON labs
BEGIN INSERT INTO world_changes (kind, id) VALUES (6, OLD.id); END;
CREATE TRIGGER world_labs_update AFTER UPDATE ON labs
BEGIN INSERT INTO world_changes (kind, id) VALUES (6, NEW.id); END;

CREATE TRIGGER world_memberships_insert AFTER INSERT ON memberships
BEGIN INSERT INTO world_changes (kind, id) VALUES (7, NEW.lab_id); END;
CREATE TRIGGER world_memberships_delete AFTER DELETE ON memberships
BEGIN INSERT INTO world_changes (kind, id) VALUES (7, OLD.lab_id); END;
CREATE TRIGGER world_memberships_update AFTER UPDATE ON memberships
BEGIN INSERT INTO world_changes (kind, id) VALUES (7, NEW.lab_id); END;

CREATE TRIGGER world_datasets_insert AFTER INSERT ON datasets
BEGIN INSERT INTO world_changes (kind, id) VALUES (8, NEW.lab_id); END;
CREATE TRIGGER world_datasets_delete AFTER DELETE ON datasets
BEGIN INSERT INTO world_changes (kind, id) VALUES (8, OLD.lab_id); END;
CREATE TRIGGER world_datasets_update AFTER UPDATE ON datasets
BEGIN INSERT INTO world_changes (kind, id) VALUES (8, NEW.lab_id); END;
