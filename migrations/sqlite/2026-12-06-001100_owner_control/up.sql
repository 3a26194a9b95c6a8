-- Owner control (issue 11): the server's capacity as its agent reports it (0: unknown),
-- and a GPU's fault as the agent reports it (the GPU is withdrawn while it has one).
ALTER TABLE nodes ADD COLUMN cpus DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN memory_mb BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN disk_gb BIGINT NOT NULL DEFAULT 0;
ALTER TABLE gpus ADD COLUMN fault TEXT;
