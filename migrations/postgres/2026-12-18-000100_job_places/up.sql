-- A waiting job's place in the queue and its estimated start move out of the wide `jobs`
-- rows into a narrow table PostgreSQL does not log. The scheduler rewrites every waiting
-- job's place every ten seconds (all of them move when the jobs ahead start): as a
-- column of `jobs` each move wrote a new version of the whole row and its WAL, and the
-- statement took 0.1-4 s at 34,000 waiting jobs, slowing every other writer. Both values
-- are derived and written again by the next rounds; after a crash of the database the
-- table is empty, and the scheduler, whose leader lock ended with its connection, reads
-- its world afresh when it takes the lock again and writes them. A job that leaves the
-- queue, or comes back to it, loses its row (trigger below); a cancel that commits while
-- the scheduler writes places may leave one behind, so readers show the places of
-- queued jobs only.
CREATE UNLOGGED TABLE job_places (
    job_id BIGINT PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    queue_position INTEGER,
    estimated_start_at TIMESTAMP
);
INSERT INTO job_places (job_id, queue_position, estimated_start_at)
    SELECT id, queue_position, estimated_start_at FROM jobs
    WHERE state = 'queued' AND (queue_position IS NOT NULL OR estimated_start_at IS NOT NULL);
ALTER TABLE jobs DROP COLUMN queue_position, DROP COLUMN estimated_start_at;

CREATE FUNCTION job_places_leave() RETURNS trigger AS $$
BEGIN
    DELETE FROM job_places WHERE job_id = NEW.id;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;
CREATE TRIGGER job_places_leave AFTER UPDATE OF state ON jobs
    FOR EACH ROW WHEN (OLD.state <> NEW.state AND (OLD.state = 'queued' OR NEW.state = 'queued'))
    EXECUTE FUNCTION job_places_leave();
