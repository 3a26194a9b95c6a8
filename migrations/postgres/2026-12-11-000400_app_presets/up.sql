-- App presets: a web app that operators (lab_id NULL: the whole campus) or a lab's
-- admins describe once and users launch from a short form. `command` is the template
-- as a JSON array (with {port} and {base_url}); `user_sets` the settings a user may
-- change, comma-separated (gpus,hours,cpus,memory_gb).
CREATE TABLE app_presets (
    id BIGSERIAL PRIMARY KEY,
    lab_id BIGINT REFERENCES labs(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    title TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    colour TEXT NOT NULL,
    image TEXT NOT NULL,
    command TEXT NOT NULL,
    port INTEGER NOT NULL,
    gpus INTEGER NOT NULL,
    max_gpus INTEGER NOT NULL,
    hours INTEGER NOT NULL,
    max_hours INTEGER NOT NULL,
    cpus DOUBLE PRECISION NOT NULL,
    max_cpus DOUBLE PRECISION NOT NULL,
    memory_gb DOUBLE PRECISION NOT NULL,
    max_memory_gb DOUBLE PRECISION NOT NULL,
    user_sets TEXT NOT NULL DEFAULT '',
    idle_minutes INTEGER NOT NULL,
    updated_by TEXT NOT NULL,
    updated_at TIMESTAMP NOT NULL
);
CREATE UNIQUE INDEX app_presets_lab_name ON app_presets (COALESCE(lab_id, 0), name);
-- A job's app's idle limit (NULL: none), and when the portal last warned that it would
-- end for want of use (cleared in effect by any later activity).
ALTER TABLE job_apps ADD COLUMN idle_minutes INTEGER;
ALTER TABLE job_apps ADD COLUMN idle_warned_at TIMESTAMP;
