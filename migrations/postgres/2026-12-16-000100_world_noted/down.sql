-- Every change of a job's reason is logged again.
DROP TRIGGER world_jobs_update ON jobs;
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
