ALTER TABLE job_apps DROP COLUMN idle_warned_at;
ALTER TABLE job_apps DROP COLUMN idle_minutes;
DROP INDEX app_presets_lab_name;
DROP TABLE app_presets;
