DROP TABLE job_templates;
