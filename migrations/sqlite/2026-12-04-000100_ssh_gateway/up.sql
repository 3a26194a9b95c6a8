-- The SSH gateway's host key, as the deployment first used it: every replica must serve
-- the same one (a replica with another refuses to start its gateway), and job pages show
-- its fingerprint. The private key stays in a file; only the public half is here.
CREATE TABLE ssh_host_keys (
    algorithm TEXT PRIMARY KEY NOT NULL,
    public_key TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL
);

-- Messages for an agent whose WebSocket another portal replica holds (an SSH relay the
-- replica of the user's SSH connection asks for). The holding replica takes them out.
CREATE TABLE agent_mail (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    node_id BIGINT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
    body TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL
);
CREATE INDEX agent_mail_node ON agent_mail (node_id);
