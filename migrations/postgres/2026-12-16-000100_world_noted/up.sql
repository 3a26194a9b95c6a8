-- A waiting job's reason, written by the scheduler itself (`plan::set_waiting`), leaves
-- no change in the log: the scheduler notes what it wrote in its world already
-- (`World::noted_waiting`), as it does for places and estimates. Without this, every
-- round reread the thousands of waiting jobs whose reason it had rewritten in the round
-- before (a reason can name the job a waiting job is behind, which moves as jobs start).
-- The scheduler's transaction sets `commons.world_noted` to 'on' (SET LOCAL); every other
-- writer's change of a reason, and any other column, is logged as before.
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
        OR (OLD.reason IS DISTINCT FROM NEW.reason
            AND current_setting('commons.world_noted', true) IS DISTINCT FROM 'on')
        OR OLD.array_id IS DISTINCT FROM NEW.array_id
        OR OLD.held IS DISTINCT FROM NEW.held
        OR OLD.datasets IS DISTINCT FROM NEW.datasets
        OR OLD.inputs IS DISTINCT FROM NEW.inputs
        OR OLD.gpu_milli IS DISTINCT FROM NEW.gpu_milli
        OR OLD.gpu_share_memory_mb IS DISTINCT FROM NEW.gpu_share_memory_mb
    ) EXECUTE FUNCTION world_change_jobs();
