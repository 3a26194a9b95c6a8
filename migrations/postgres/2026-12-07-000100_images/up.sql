-- The image allow-list: NAME:TAG entries pinned to the image's digest (its ID in the
-- Docker Engine), campus-wide (lab_id NULL) or for one lab. A job may name only an image
-- on its lab's list or the campus list; the job keeps the digest (and signature) it was
-- allowed with, and its agent runs that digest only.
CREATE TABLE image_allows (
    id BIGSERIAL PRIMARY KEY,
    lab_id BIGINT REFERENCES labs(id) ON DELETE CASCADE,
    name_tag TEXT NOT NULL,
    digest TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    -- An SSH signature (SSHSIG, armored) over "gpu-commons-image-v1 NAME:TAG@DIGEST",
    -- checked against the campus image authority keys when the entry was added.
    signature TEXT,
    signed_by TEXT,
    created_by TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL
);
CREATE UNIQUE INDEX image_allows_lab_name ON image_allows (COALESCE(lab_id, 0), name_tag);
ALTER TABLE jobs ADD COLUMN image_digest TEXT;
ALTER TABLE jobs ADD COLUMN image_signature TEXT;
-- The lab's jobs may use signed entries only.
ALTER TABLE labs ADD COLUMN require_signed_images BOOLEAN NOT NULL DEFAULT FALSE;
