-- A job that serves a web app: the port it listens on inside its container and the
-- random label that names its own origin (`{host}` in `[apps] url`), and that origin's
-- URL as it was made at submission. Kept beside `jobs` so that submitting a job without
-- an app writes nothing here.
CREATE TABLE job_apps (
    job_id BIGINT PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    port INTEGER NOT NULL,
    host TEXT NOT NULL UNIQUE,
    url TEXT NOT NULL,
    last_activity_at TIMESTAMP
);
-- What lets a browser into an app: a one-time `code` (minted by the portal for the
-- job's owner, redeemed once by the app's origin) or a `session` (the app origin's
-- HttpOnly cookie). Only the SHA-256 of the secret is kept.
CREATE TABLE app_grants (
    secret_sha256 TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    job_id BIGINT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    user_id BIGINT NOT NULL,
    expires_at TIMESTAMP NOT NULL
);
CREATE INDEX app_grants_expiry ON app_grants (expires_at);
