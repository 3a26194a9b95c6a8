DROP TABLE app_grants;
DROP TABLE job_apps;
