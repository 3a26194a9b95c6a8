//! What the portal's REST API and the `commons` CLI must agree on, written once: the job
//! request (`POST /api/v1/jobs`, and the CLI's job files) and the pure rules that check
//! it. The portal checks every request with these rules; the CLI checks with the same
//! rules before it sends anything, so a bad field is refused in the same words on both
//! sides.
//!
//! Invariants: no I/O, no clock, no database. A failed rule is an [`Invalid`] that names
//! the request's field (`gpus`, `time_limit_minutes`, ...). Rules that need the portal's
//! knowledge (which labs a user belongs to) stay in the portal.

pub mod image;
pub mod job;
pub mod rules;

pub use job::{JobKind, JobRequest};

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
