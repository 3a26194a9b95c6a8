//! What the portal's REST API (`/api/v1`) and the `commons` CLI must agree on, written
//! once: every request and response body (the portal serialises these types, the CLI
//! deserialises the same ones), the states as enums, and the pure rules that check a job
//! request. The portal checks every request with these rules; the CLI checks with the
//! same rules before it sends anything, so a bad field is refused in the same words on
//! both sides. With the `openapi` feature each type also has its JSON Schema, from which
//! the portal builds its OpenAPI document (`GET /api/v1/openapi.json`).
//!
//! Invariants: no I/O, no clock, no database. A failed rule is an [`Invalid`] that names
//! the request's field (`gpus`, `time_limit_minutes`, ...). Rules that need the portal's
//! knowledge (which labs a user belongs to) stay in the portal. Request bodies refuse
//! unknown fields; responses do not, so an older CLI reads a newer portal's answers.

pub mod account;
pub mod app_preset;
pub mod array;
pub mod cli_login;
pub mod datasets;
pub mod error;
pub mod files;
pub mod flows;
pub mod image;
pub mod job;
pub mod job_view;
pub mod node;
pub mod notify;
pub mod overview;
pub mod rules;
pub mod ssh;
pub mod uploads;
pub mod utilization;
pub mod web_app;

pub use error::ErrorBody;
pub use job::{JobKind, JobRequest};
pub use job_view::{JobEvent, JobState, JobView, LabJobView, Staging};

/// A value that breaks a rule: which field, and why, in words a researcher understands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    /// The request's field at fault (`gpus`, `env`, ...).
    pub field: String,
    pub message: String,
}

impl Invalid {
    pub fn new(field: &str, message: impl Into<String>) -> Invalid {
        Invalid {
            field: field.to_string(),
            message: message.into(),
        }
    }
}
