ALTER TABLE labs DROP COLUMN require_signed_images;
ALTER TABLE jobs DROP COLUMN image_signature;
ALTER TABLE jobs DROP COLUMN image_digest;
DROP INDEX image_allows_lab_name;
DROP TABLE image_allows;
