DROP TABLE audit_log;
ALTER TABLE labs DROP COLUMN member_quota;
ALTER TABLE memberships DROP COLUMN source;
DROP INDEX users_oidc_identity;
ALTER TABLE users DROP COLUMN operator_manual;
ALTER TABLE users DROP COLUMN oidc_subject;
ALTER TABLE users DROP COLUMN oidc_issuer;
