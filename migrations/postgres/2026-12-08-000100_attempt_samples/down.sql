DROP TABLE attempt_samples;
