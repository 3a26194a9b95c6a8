DROP INDEX job_attempts_node;
