-- A node's attempts by state: every heartbeat renews the node's active attempts and
-- reads its running ones. Without it each heartbeat scanned every active attempt on
-- campus (16,000 at 2,000 servers: 400 heartbeats/s saturated PostgreSQL).
CREATE INDEX job_attempts_node ON job_attempts (node_id, state);
