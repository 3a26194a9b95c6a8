-- Uploads in parts (issue 28): a resumable upload is a file_uploads row that names who
-- started it and the file's size (and SHA-256 when given); its parts are rows here,
-- each stored as its own object until the upload completes.
ALTER TABLE file_uploads ADD COLUMN resumable_by BIGINT;
ALTER TABLE file_uploads ADD COLUMN size BIGINT;
ALTER TABLE file_uploads ADD COLUMN sha256 TEXT;
CREATE TABLE file_upload_parts (
    upload_id BIGINT NOT NULL,
    n INTEGER NOT NULL,
    bytes BIGINT NOT NULL,
    PRIMARY KEY (upload_id, n)
);
CREATE INDEX file_uploads_resumable_by ON file_uploads (resumable_by);
