-- Every change of a job's reason is logged again.
DROP TRIGGER world_jobs_update;
DROP TABLE world_noted;
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
