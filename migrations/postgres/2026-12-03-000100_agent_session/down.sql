ALTER TABLE nodes DROP COLUMN agent_seq_at;
ALTER TABLE nodes DROP COLUMN agent_seq;
ALTER TABLE nodes DROP COLUMN agent_session;
