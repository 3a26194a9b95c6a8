-- What a personal access token may do besides the API's ordinary work: add SSH keys and
-- make more tokens. Tokens made before (on the Tokens page, by the admin CLI) keep it; a
-- browser sign-in of `commons login` gets it only when the user ticks it when approving.
ALTER TABLE api_tokens ADD COLUMN can_add_credentials BOOLEAN NOT NULL DEFAULT TRUE;
-- Where a CLI sign-in came from (the client address, as the approval page shows it and as
-- the per-address limit counts it), the poll interval it must keep (RFC 8628: grows by 5 s
-- at each poll that comes too early), when it last polled, and the right the user gave.
ALTER TABLE cli_logins ADD COLUMN client_addr TEXT NOT NULL DEFAULT '';
ALTER TABLE cli_logins ADD COLUMN interval_s BIGINT NOT NULL DEFAULT 5;
ALTER TABLE cli_logins ADD COLUMN last_polled_at TIMESTAMP;
ALTER TABLE cli_logins ADD COLUMN can_add_credentials BOOLEAN NOT NULL DEFAULT FALSE;
CREATE INDEX cli_logins_by_addr ON cli_logins (client_addr);
