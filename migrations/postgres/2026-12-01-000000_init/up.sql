-- GPU Commons schema, PostgreSQL flavour. Keep in step with ../../sqlite (same names, same meaning).
CREATE TABLE labs (
    id BIGSERIAL PRIMARY KEY,
    slug TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL
);

CREATE TABLE users (
    id BIGSERIAL PRIMARY KEY,
    username TEXT NOT NULL UNIQUE,
    email TEXT NOT NULL,
    display_name TEXT NOT NULL DEFAULT '',
    is_operator BOOLEAN NOT NULL DEFAULT FALSE,
    created_at TIMESTAMP NOT NULL
);

CREATE TABLE memberships (
    user_id BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    lab_id BIGINT NOT NULL REFERENCES labs(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    PRIMARY KEY (user_id, lab_id)
);

CREATE TABLE api_tokens (
    id BIGSERIAL PRIMARY KEY,
    user_id BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_at TIMESTAMP NOT NULL,
    expires_at TIMESTAMP,
    last_used_at TIMESTAMP,
    revoked_at TIMESTAMP
);

CREATE TABLE nodes (
    id BIGSERIAL PRIMARY KEY,
    lab_id BIGINT NOT NULL REFERENCES labs(id),
    name TEXT NOT NULL,
    credential_hash TEXT NOT NULL UNIQUE,
    agent_version TEXT NOT NULL DEFAULT '',
    online BOOLEAN NOT NULL DEFAULT FALSE,
    last_seen_at TIMESTAMP,
    created_at TIMESTAMP NOT NULL,
    revoked_at TIMESTAMP
);

CREATE TABLE enrol_tokens (
    id BIGSERIAL PRIMARY KEY,
    lab_id BIGINT NOT NULL REFERENCES labs(id) ON DELETE CASCADE,
    token_hash TEXT NOT NULL UNIQUE,
    created_at TIMESTAMP NOT NULL,
    expires_at TIMESTAMP NOT NULL,
    used_at TIMESTAMP,
    node_id BIGINT REFERENCES nodes(id)
);

CREATE TABLE gpus (
    id BIGSERIAL PRIMARY KEY,
    node_id BIGINT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    uuid TEXT NOT NULL,
    idx INTEGER NOT NULL,
    model TEXT NOT NULL,
    memory_mb BIGINT NOT NULL,
    is_fake BOOLEAN NOT NULL DEFAULT FALSE,
    present BOOLEAN NOT NULL DEFAULT TRUE,
    local_use BOOLEAN NOT NULL DEFAULT FALSE,
    utilization_pct INTEGER NOT NULL DEFAULT 0,
    UNIQUE (node_id, uuid)
);

CREATE TABLE jobs (
    id BIGSERIAL PRIMARY KEY,
    user_id BIGINT NOT NULL REFERENCES users(id),
    lab_id BIGINT NOT NULL REFERENCES labs(id),
    image TEXT NOT NULL,
    command TEXT NOT NULL,
    env TEXT NOT NULL,
    gpus INTEGER NOT NULL,
    gpu_models TEXT NOT NULL,
    min_gpu_memory_mb BIGINT NOT NULL,
    cpus DOUBLE PRECISION NOT NULL,
    memory_mb BIGINT NOT NULL,
    time_limit_s BIGINT NOT NULL,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    queue_position INTEGER,
    exit_code BIGINT,
    attempts INTEGER NOT NULL DEFAULT 0,
    node_id BIGINT REFERENCES nodes(id),
    log_bytes BIGINT NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL,
    started_at TIMESTAMP,
    finished_at TIMESTAMP
);
CREATE INDEX jobs_user ON jobs (user_id, id);
CREATE INDEX jobs_state ON jobs (state);

CREATE TABLE job_attempts (
    id BIGSERIAL PRIMARY KEY,
    job_id BIGINT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    node_id BIGINT NOT NULL REFERENCES nodes(id),
    gpu_ids TEXT NOT NULL,
    state TEXT NOT NULL,
    lease_until TIMESTAMP NOT NULL,
    created_at TIMESTAMP NOT NULL,
    started_at TIMESTAMP,
    ended_at TIMESTAMP,
    exit_code BIGINT,
    reason TEXT,
    UNIQUE (job_id, attempt)
);
CREATE INDEX job_attempts_state ON job_attempts (state);

CREATE TABLE job_events (
    id BIGSERIAL PRIMARY KEY,
    job_id BIGINT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    at TIMESTAMP NOT NULL,
    state TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX job_events_job ON job_events (job_id, id);

CREATE TABLE job_logs (
    id BIGSERIAL PRIMARY KEY,
    job_id BIGINT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    chunk TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL
);
CREATE INDEX job_logs_job ON job_logs (job_id, id);
