UPDATE job_attempts SET gpu_ids = REPLACE(REPLACE(gpu_ids, '[', ''), ']', '') WHERE gpu_ids LIKE '[%';
