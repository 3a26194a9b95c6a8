ALTER TABLE jobs DROP COLUMN image_campus;
