ALTER TABLE memberships DROP COLUMN files_quota_gb;
ALTER TABLE labs DROP COLUMN files_quota_gb;
DROP TABLE file_spaces;
DROP TABLE file_uploads;
DROP TABLE files;
