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
    seq BIGSERIAL PRIMARY KEY,
    kind SMALLINT NOT NULL,
    id BIGINT NOT NULL
);

CREATE FUNCTION world_change_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO world_changes (kind, id) VALUES (1, OLD.id);
    ELSE
        INSERT INTO world_changes (kind, id) VALUES (1, NEW.id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER world_jobs_rows AFTER INSERT OR DELETE ON jobs
    FOR EACH ROW EXECUTE FUNCTION world_change_jobs();
CREATE TRIGGER world_jobs_update AFTER UPDATE ON jobs
    FOR EACH ROW WHEN (
        OLD.user_id IS DISTINCT FROM NEW.user_id
        OR OLD.lab_id IS DISTINCT FROM NEW.lab_id
        OR OLD.gpus IS DISTINCT FROM NEW.gpus
        OR OLD.gpu_models IS DISTINCT FROM NEW.gpu_models
        OR OLD.min_gpu_memory_mb IS DISTINCT FROM NEW.min_gpu_memory_mb
        OR OLD.cpus IS DISTINCT FROM NEW.cpus
        OR OLD.memory_mb IS DISTINCT FROM NEW.memory_mb
        OR OLD.disk_gb IS DISTINCT FROM NEW.disk_gb
        OR OLD.time_limit_s IS DISTINCT FROM NEW.time_limit_s
        OR OLD.kind IS DISTINCT FROM NEW.kind
        OR OLD.state IS DISTINCT FROM NEW.state
        OR OLD.created_at IS DISTINCT FROM NEW.created_at
        OR OLD.reason IS DISTINCT FROM NEW.reason
        OR OLD.array_id IS DISTINCT FROM NEW.array_id
        OR OLD.held IS DISTINCT FROM NEW.held
        OR OLD.datasets IS DISTINCT FROM NEW.datasets
        OR OLD.inputs IS DISTINCT FROM NEW.inputs
        OR OLD.gpu_milli IS DISTINCT FROM NEW.gpu_milli
        OR OLD.gpu_share_memory_mb IS DISTINCT FROM NEW.gpu_share_memory_mb
    ) EXECUTE FUNCTION world_change_jobs();

CREATE FUNCTION world_change_job_attempts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO world_changes (kind, id) VALUES (2, OLD.job_id);
    ELSE
        INSERT INTO world_changes (kind, id) VALUES (2, NEW.job_id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER world_job_attempts_rows AFTER INSERT OR DELETE ON job_attempts
    FOR EACH ROW EXECUTE FUNCTION world_change_job_attempts();
CREATE TRIGGER world_job_attempts_update AFTER UPDATE ON job_attempts
    FOR EACH ROW WHEN (
        OLD.job_id IS DISTINCT FROM NEW.job_id
        OR OLD.attempt IS DISTINCT FROM NEW.attempt
        OR OLD.node_id IS DISTINCT FROM NEW.node_id
        OR OLD.gpu_ids IS DISTINCT FROM NEW.gpu_ids
        OR OLD.state IS DISTINCT FROM NEW.state
        OR OLD.created_at IS DISTINCT FROM NEW.created_at
        OR OLD.started_at IS DISTINCT FROM NEW.started_at
        OR OLD.ended_at IS DISTINCT FROM NEW.ended_at
        OR OLD.share_milli IS DISTINCT FROM NEW.share_milli
        OR OLD.share_memory_mb IS DISTINCT FROM NEW.share_memory_mb
    ) EXECUTE FUNCTION world_change_job_attempts();

CREATE FUNCTION world_change_nodes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO world_changes (kind, id) VALUES (3, OLD.id);
    ELSE
        INSERT INTO world_changes (kind, id) VALUES (3, NEW.id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER world_nodes_rows AFTER INSERT OR DELETE ON nodes
    FOR EACH ROW EXECUTE FUNCTION world_change_nodes();
CREATE TRIGGER world_nodes_update AFTER UPDATE ON nodes
    FOR EACH ROW WHEN (
        OLD.lab_id IS DISTINCT FROM NEW.lab_id
        OR OLD.name IS DISTINCT FROM NEW.name
        OR OLD.online IS DISTINCT FROM NEW.online
        OR OLD.revoked_at IS DISTINCT FROM NEW.revoked_at
        OR OLD.lending IS DISTINCT FROM NEW.lending
        OR OLD.grace_s IS DISTINCT FROM NEW.grace_s
        OR OLD.reclaim IS DISTINCT FROM NEW.reclaim
        OR OLD.draining IS DISTINCT FROM NEW.draining
        OR OLD.cpus IS DISTINCT FROM NEW.cpus
        OR OLD.memory_mb IS DISTINCT FROM NEW.memory_mb
        OR OLD.max_job_disk_gb IS DISTINCT FROM NEW.max_job_disk_gb
        OR OLD.disk_low IS DISTINCT FROM NEW.disk_low
        OR OLD.inventory_unapproved IS DISTINCT FROM NEW.inventory_unapproved
        OR OLD.datasets IS DISTINCT FROM NEW.datasets
        OR OLD.share_mode IS DISTINCT FROM NEW.share_mode
    ) EXECUTE FUNCTION world_change_nodes();

CREATE FUNCTION world_change_gpus() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO world_changes (kind, id) VALUES (4, OLD.id);
    ELSE
        INSERT INTO world_changes (kind, id) VALUES (4, NEW.id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER world_gpus_rows AFTER INSERT OR DELETE ON gpus
    FOR EACH ROW EXECUTE FUNCTION world_change_gpus();
CREATE TRIGGER world_gpus_update AFTER UPDATE ON gpus
    FOR EACH ROW WHEN (
        OLD.node_id IS DISTINCT FROM NEW.node_id
        OR OLD.model IS DISTINCT FROM NEW.model
        OR OLD.memory_mb IS DISTINCT FROM NEW.memory_mb
        OR OLD.present IS DISTINCT FROM NEW.present
        OR OLD.local_use IS DISTINCT FROM NEW.local_use
        OR OLD.idle_since IS DISTINCT FROM NEW.idle_since
        OR OLD.fault IS DISTINCT FROM NEW.fault
    ) EXECUTE FUNCTION world_change_gpus();

CREATE FUNCTION world_change_checkpoints() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO world_changes (kind, id) VALUES (5, OLD.job_id);
    ELSE
        INSERT INTO world_changes (kind, id) VALUES (5, NEW.job_id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER world_checkpoints_rows AFTER INSERT OR DELETE ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION world_change_checkpoints();
CREATE TRIGGER world_checkpoints_update AFTER UPDATE ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION world_change_checkpoints();

CREATE FUNCTION world_change_labs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO world_changes (kind, id) VALUES (6, OLD.id);
    ELSE
        INSERT INTO world_changes (kind, id) VALUES (6, NEW.id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER world_labs_rows AFTER INSERT OR DELETE ON labs
    FOR EACH ROW EXECUTE FUNCTION world_change_labs();
CREATE TRIGGER world_labs_update AFTER UPDATE ON labs
    FOR EACH ROW EXECUTE FUNCTION world_change_labs();

CREATE FUNCTION world_change_memberships() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO world_changes (kind, id) VALUES (7, OLD.lab_id);
    ELSE
        INSERT INTO world_changes (kind, id) VALUES (7, NEW.lab_id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER world_memberships_rows AFTER INSERT OR DELETE ON memberships
    FOR EACH ROW EXECUTE FUNCTION world_change_memberships();
CREATE TRIGGER world_memberships_update AFTER UPDATE ON memberships
    FOR EACH ROW EXECUTE FUNCTION world_change_memberships();

CREATE FUNCTION world_change_datasets() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO world_changes (kind, id) VALUES (8, OLD.lab_id);
    ELSE
        INSERT INTO world_changes (kind, id) VALUES (8, NEW.lab_id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER world_datasets_rows AFTER INSERT OR DELETE ON datasets
    FOR EACH ROW EXECUTE FUNCTION world_change_datasets();
CREATE TRIGGER world_datasets_update AFTER UPDATE ON datasets
    FOR EACH ROW EXECUTE FUNCTION world_change_datasets();
