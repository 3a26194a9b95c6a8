-- Sign-ins of the `commons` CLI through the browser: the OAuth 2.0 device authorization
-- grant (RFC 8628) with the portal as the authorization server. The CLI holds the device
-- code (stored hashed); the user, signed in to the portal (campus SSO), confirms the
-- short user code on /cli/device; the CLI's next poll gets a personal access token, once
-- (redeemed_at). Rows live minutes; expired ones are removed when new ones are made.
CREATE TABLE cli_logins (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    device_code_hash TEXT NOT NULL UNIQUE,
    user_code TEXT NOT NULL UNIQUE,
    client_name TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL,
    expires_at TIMESTAMP NOT NULL,
    user_id BIGINT REFERENCES users(id) ON DELETE CASCADE,
    approved_at TIMESTAMP,
    denied_at TIMESTAMP,
    redeemed_at TIMESTAMP
);
CREATE INDEX cli_logins_expires ON cli_logins (expires_at);
