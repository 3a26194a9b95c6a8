DROP INDEX jobs_array;
ALTER TABLE jobs DROP COLUMN array_index;
ALTER TABLE jobs DROP COLUMN array_id;
DROP TABLE arrays;
