-- Files in the campus object store: a user's own space ('user:<id>') and a lab's shared
-- one ('lab:<id>'). One row per file: listings, downloads and the quotas read these
-- rows, never the store. `object` is the key of the file's contents in the store, a
-- fresh one per upload, so a file is replaced by switching its row to the new object
-- in one transaction (service::files explains why the path is not the key).
CREATE TABLE files (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    space TEXT NOT NULL,
    path TEXT NOT NULL,
    object TEXT NOT NULL,
    bytes BIGINT NOT NULL,
    sha256 TEXT NOT NULL,
    modified_at TIMESTAMP NOT NULL,
    UNIQUE (space, path)
);
-- Uploads under way: `reserved` bytes count against the space's quota while the body
-- streams in (counted in grants as the bytes arrive). An upload that is not touched for
-- a while (its portal died) is swept with its object.
CREATE TABLE file_uploads (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    space TEXT NOT NULL,
    path TEXT NOT NULL,
    object TEXT NOT NULL UNIQUE,
    reserved BIGINT NOT NULL,
    started_at TIMESTAMP NOT NULL,
    touched_at TIMESTAMP NOT NULL
);
CREATE INDEX file_uploads_space ON file_uploads (space);
-- One row per space that ever had an upload: the row PostgreSQL locks so that two
-- uploads into one space are counted against its quota one after the other.
CREATE TABLE file_spaces (
    space TEXT PRIMARY KEY
);
-- A lab's own quota for its shared space in GB (operators); NULL: [files] lab_quota_gb.
ALTER TABLE labs ADD COLUMN files_quota_gb DOUBLE PRECISION;
-- A member's quota for their own space in GB (the lab's admins); NULL: none from this
-- lab. A user's quota is the largest their labs set, else [files] user_quota_gb.
ALTER TABLE memberships ADD COLUMN files_quota_gb DOUBLE PRECISION;
