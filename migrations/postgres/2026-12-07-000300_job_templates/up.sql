-- Saved job templates, per user: the submit form's fields under a name, to fill the form
-- again later. Deleted with their user.
CREATE TABLE job_templates (
    id BIGSERIAL PRIMARY KEY,
    user_id BIGINT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    form TEXT NOT NULL,
    created_at TIMESTAMP NOT NULL,
    UNIQUE (user_id, name)
);
