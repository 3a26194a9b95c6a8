-- Browser sessions, kept by the portal (the cookie carries only a random key, encrypted):
-- logging out or an operator's "sign out everywhere" deletes the row, so a copied cookie
-- is worth nothing afterwards; idle expiry is the row's expires_at, pushed out as the
-- user makes requests; the absolute expiry is the login time inside the state. The key
-- is stored as its SHA-256, so reading this table gives no working cookie.
CREATE TABLE web_sessions (
    id_hash TEXT PRIMARY KEY NOT NULL,
    user_id BIGINT REFERENCES users(id) ON DELETE CASCADE,
    state TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL,
    expires_at TIMESTAMP NOT NULL
);
CREATE INDEX web_sessions_user ON web_sessions (user_id);
CREATE INDEX web_sessions_expires ON web_sessions (expires_at);
