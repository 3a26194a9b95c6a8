ALTER TABLE jobs RESET (fillfactor);
ALTER TABLE job_attempts RESET (fillfactor);
ALTER TABLE nodes RESET (fillfactor);
ALTER TABLE gpus RESET (fillfactor);
