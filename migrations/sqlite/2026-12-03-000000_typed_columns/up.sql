-- Attempts' GPU ids become a JSON array like every other list column ("3,4" -> "[3,4]"),
-- read through a column type that refuses text it cannot parse.
UPDATE job_attempts SET gpu_ids = '[' || gpu_ids || ']' WHERE gpu_ids NOT LIKE '[%';
