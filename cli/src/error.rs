//! What can go wrong, each as one clear line, and the exit code it gives (the table in
//! docs/src/user/cli.md). A refused field names it; a portal that cannot be reached, a
//! refused token and a 403 each say so, and what to do.

/// Exit codes (besides a followed job's own exit code).
pub mod exit {
    /// The portal refused the request, or another error.
    pub const ERROR: u8 = 1;
    /// A bad command line or job field, refused before anything was sent.
    pub const USAGE: u8 = 2;
    /// The portal could not be reached.
    pub const UNREACHABLE: u8 = 3;
    /// Not signed in, or the token was refused (expired, revoked).
    pub const UNAUTHENTICATED: u8 = 4;
    /// Signed in, but not allowed (403).
    pub const FORBIDDEN: u8 = 5;
    /// A followed job ended without an exit code of its own (cancelled, could not start).
    pub const NO_EXIT_CODE: u8 = 125;
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A bad argument or job file.
    #[error("{0}")]
    Usage(String),
    /// A field that breaks a rule (checked here, or by the portal).
    #[error("invalid {field}: {message}")]
    Invalid { field: String, message: String },
    #[error("cannot reach the portal at {url}: {why}")]
    Unreachable { url: String, why: String },
    #[error("not signed in: run `commons login URL` first")]
    NotLoggedIn,
    #[error("the portal refused the token ({message}); sign in again: commons login {url}")]
    TokenRefused { url: String, message: String },
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// Any other refusal by the portal: its message, and the status when no message.
    #[error("{message}")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    #[error("{0:#}")]
    Other(#[from] anyhow::Error),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) | CliError::Invalid { .. } => exit::USAGE,
            CliError::Unreachable { .. } => exit::UNREACHABLE,
            CliError::NotLoggedIn | CliError::TokenRefused { .. } => exit::UNAUTHENTICATED,
            CliError::Forbidden(_) => exit::FORBIDDEN,
            CliError::Api { .. } | CliError::Other(_) => exit::ERROR,
        }
    }
}

impl From<commons_api::Invalid> for CliError {
    fn from(e: commons_api::Invalid) -> Self {
        CliError::Invalid {
            field: e.field,
            message: e.message,
        }
    }
}

pub type Result<T> = std::result::Result<T, CliError>;
