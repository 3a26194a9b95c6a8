DROP INDEX file_uploads_resumable_by;
DROP TABLE file_upload_parts;
ALTER TABLE file_uploads DROP COLUMN sha256;
ALTER TABLE file_uploads DROP COLUMN size;
ALTER TABLE file_uploads DROP COLUMN resumable_by;
