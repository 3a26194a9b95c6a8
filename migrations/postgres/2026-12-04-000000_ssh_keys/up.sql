-- Users' SSH public keys, which the SSH gateway accepts for their jobs. A key (its
-- SHA-256 fingerprint, which ignores the comment) belongs to one user only, so a key
-- always names one person.
CREATE TABLE ssh_keys (
    id BIGSERIAL PRIMARY KEY,
    user_id BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    fingerprint TEXT NOT NULL UNIQUE,
    public_key TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL,
    last_used_at TIMESTAMP
);
CREATE INDEX ssh_keys_user ON ssh_keys (user_id);
