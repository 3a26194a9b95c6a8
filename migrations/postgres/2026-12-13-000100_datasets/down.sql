ALTER TABLE nodes DROP COLUMN datasets;
ALTER TABLE jobs DROP COLUMN datasets;
DROP TABLE datasets;
