DROP INDEX cli_logins_by_addr;
ALTER TABLE cli_logins DROP COLUMN can_add_credentials;
ALTER TABLE cli_logins DROP COLUMN last_polled_at;
ALTER TABLE cli_logins DROP COLUMN interval_s;
ALTER TABLE cli_logins DROP COLUMN client_addr;
ALTER TABLE api_tokens DROP COLUMN can_add_credentials;
