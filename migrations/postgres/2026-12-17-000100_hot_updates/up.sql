-- Room on each page for a row's next version (issue 33). The scheduler rewrites every
-- waiting job's place and estimate every few seconds, agents renew leases and report
-- GPU figures with every heartbeat: none of those columns is indexed, so PostgreSQL can
-- update the row in place on its page (a heap-only tuple: no new entry in any of the
-- table's indexes) when the page has room for the new version. With full pages (the
-- default fillfactor, 100) every such update moved the row to another page and added an
-- entry to each index: the 34,000-row write of the waiting jobs' places took 0.4-4 s in
-- the load test and slowed every other writer meanwhile. Pages written from now on keep
-- the room; those written before keep theirs full until rewritten.
ALTER TABLE jobs SET (fillfactor = 70);
ALTER TABLE job_attempts SET (fillfactor = 80);
ALTER TABLE nodes SET (fillfactor = 70);
ALTER TABLE gpus SET (fillfactor = 70);
