-- Campus SSO: users keyed by (issuer, subject); memberships remember whether a group
-- rule or a person granted them; an audit log of admin actions.
ALTER TABLE users ADD COLUMN oidc_issuer TEXT;
ALTER TABLE users ADD COLUMN oidc_subject TEXT;
ALTER TABLE users ADD COLUMN operator_manual BOOLEAN NOT NULL DEFAULT 0;
CREATE UNIQUE INDEX users_oidc_identity ON users (oidc_issuer, oidc_subject);
UPDATE users SET operator_manual = is_operator;
ALTER TABLE memberships ADD COLUMN source TEXT NOT NULL DEFAULT 'manual';
ALTER TABLE labs ADD COLUMN member_quota TEXT NOT NULL DEFAULT '{}';

CREATE TABLE audit_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TIMESTAMP NOT NULL,
    actor_id BIGINT REFERENCES users(id),
    actor TEXT NOT NULL,
    lab_id BIGINT REFERENCES labs(id) ON DELETE CASCADE,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    before TEXT NOT NULL,
    after TEXT NOT NULL
);
CREATE INDEX audit_log_lab ON audit_log (lab_id, id);
