-- Shares of one GPU (issue 32). A job may ask for a share of its one GPU: compute in
-- thousandths (0: as much as its memory is of the GPU's) and memory in MiB (0: the same
-- fraction of the GPU's); both NULL: whole GPUs. An attempt records the share it holds.
-- A node records how its agent enforces shares (`mps`, `timeslice`; NULL: none).
ALTER TABLE jobs ADD COLUMN gpu_milli INTEGER;
ALTER TABLE jobs ADD COLUMN gpu_share_memory_mb BIGINT;
ALTER TABLE job_attempts ADD COLUMN share_milli INTEGER;
ALTER TABLE job_attempts ADD COLUMN share_memory_mb BIGINT;
-- GPU memory the attempt's processes use, as its agent last measured it (MiB).
ALTER TABLE job_attempts ADD COLUMN gpu_memory_used_mb BIGINT;
ALTER TABLE nodes ADD COLUMN share_mode TEXT;
