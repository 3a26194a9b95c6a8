-- Notifications (issue 30): each user's channels and events, a job's own choice of
-- events, and the delivery queue. A background task turns new job_events rows (after
-- notification_cursor) into deliveries, one per channel, and sends them with retries;
-- the queue rows are also the user's delivery log.
CREATE TABLE notification_settings (
    user_id BIGINT PRIMARY KEY REFERENCES users(id) ON DELETE CASCADE,
    email BOOLEAN NOT NULL DEFAULT FALSE,
    -- JSON list of event names; NULL: every event.
    events TEXT,
    -- JSON list of {id, url, secret}.
    webhooks TEXT NOT NULL DEFAULT '[]',
    updated_at TIMESTAMP NOT NULL
);
-- A job's `notify` list (JSON), which replaces its owner's events for that job.
CREATE TABLE job_notify (
    job_id BIGINT PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,
    events TEXT NOT NULL
);
-- The last job_events row turned into deliveries. Starts at the newest event, so a
-- portal upgraded with history sends nothing about the past.
CREATE TABLE notification_cursor (
    id INTEGER PRIMARY KEY,
    last_event_id BIGINT NOT NULL
);
INSERT INTO notification_cursor (id, last_event_id)
    SELECT 1, COALESCE(MAX(id), 0) FROM job_events;
CREATE TABLE notification_deliveries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    -- Stable across retries and replicas: evt_<job event id>.
    event_id TEXT NOT NULL,
    user_id BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    job_id BIGINT NOT NULL,
    event TEXT NOT NULL,
    -- email or webhook
    channel TEXT NOT NULL,
    -- The address, or the webhook's id.
    target TEXT NOT NULL,
    -- What is sent: the JSON body (webhooks) or the subject and text (e-mail), as JSON.
    payload TEXT NOT NULL,
    -- pending, sent or failed (gave up)
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at TIMESTAMP NOT NULL,
    next_at TIMESTAMP NOT NULL,
    -- A replica that took the row to send it holds it until then.
    claimed_until TIMESTAMP,
    last_at TIMESTAMP,
    last_answer TEXT,
    UNIQUE (event_id, channel, target)
);
CREATE INDEX notification_deliveries_due ON notification_deliveries (next_at) WHERE status = 'pending';
CREATE INDEX notification_deliveries_user ON notification_deliveries (user_id, id);
