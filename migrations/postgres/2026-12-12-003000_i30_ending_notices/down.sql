DROP TABLE job_notices;
