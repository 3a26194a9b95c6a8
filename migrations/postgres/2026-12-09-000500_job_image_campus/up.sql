-- Whether a job's image pin came from the campus allow-list (true) or from its lab's
-- own (false). A lab's entries are for its own servers: on another lab's server such a
-- job runs only an image pulled there by digest, never a local copy the owners put there.
-- Jobs from before: campus when a campus entry pins the same image to the same digest;
-- otherwise treated as a lab entry, which is the safe side.
ALTER TABLE jobs ADD COLUMN image_campus BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE jobs SET image_campus = TRUE
WHERE image_digest IS NOT NULL
  AND EXISTS (SELECT 1 FROM image_allows a
              WHERE a.lab_id IS NULL AND a.name_tag = jobs.image AND a.digest = jobs.image_digest);
