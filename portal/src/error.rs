//! The portal's one error type, and how it is shown: JSON under `/api` ([`ApiError`]),
//! an HTML page in the UI ([`WebError`]). Internal causes go to the log, never to users.

use crate::db::DbError;
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum AppError {
    /// Input that breaks a rule; `field` names the culprit. `code` is the API's `error`
    /// (`invalid_input`, or a more precise one a script may act on).
    #[error("{message}")]
    Invalid {
        code: &'static str,
        field: String,
        message: String,
    },
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    /// A request body over its limit (413); the message says the limit.
    #[error("{0}")]
    TooLarge(String),
    /// An upload that would pass a quota (413); `code` names which (`file_quota`), the
    /// message says its figures.
    #[error("{message}")]
    OverQuota { code: &'static str, message: String },
    /// A body of a type the endpoint does not take (415).
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// A service we depend on is down; the message says which, in user words.
    #[error("{0}")]
    Unavailable(String),
    /// Storage we write to is at its floor (507); the message gives the figures.
    #[error("{0}")]
    InsufficientStorage(String),
    /// Too many requests of a kind from one client (429, with `Retry-After`).
    #[error("{message}")]
    TooMany {
        code: &'static str,
        message: String,
        retry_after_s: u64,
    },
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

impl AppError {
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::invalid_as("invalid_input", field, message)
    }
    /// The same with a precise code (`rsa_key_too_short`) instead of `invalid_input`.
    pub fn invalid_as(code: &'static str, field: &str, message: impl Into<String>) -> Self {
        AppError::Invalid {
            code,
            field: field.into(),
            message: message.into(),
        }
    }
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        AppError::Conflict {
            code,
            message: message.into(),
        }
    }
    pub fn status(&self) -> StatusCode {
        match self {
            AppError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            AppError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AppError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            AppError::Forbidden(_) => StatusCode::FORBIDDEN,
            AppError::NotFound(_) => StatusCode::NOT_FOUND,
            AppError::Conflict { .. } => StatusCode::CONFLICT,
            AppError::TooLarge(_) | AppError::OverQuota { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            AppError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            AppError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            AppError::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
            AppError::TooMany { .. } => StatusCode::TOO_MANY_REQUESTS,
            AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
    pub fn code(&self) -> &'static str {
        match self {
            AppError::Invalid { code, .. } => code,
            AppError::BadRequest(_) => "bad_request",
            AppError::Unauthenticated(_) => "unauthenticated",
            AppError::Forbidden(_) => "forbidden",
            AppError::NotFound(_) => "not_found",
            AppError::Conflict { code, .. } => code,
            AppError::TooLarge(_) => "too_large",
            AppError::OverQuota { code, .. } => code,
            AppError::UnsupportedMediaType(_) => "unsupported_media_type",
            AppError::Unavailable(_) => "unavailable",
            AppError::InsufficientStorage(_) => "insufficient_storage",
            AppError::TooMany { code, .. } => code,
            AppError::Internal(_) => "internal",
        }
    }
    pub fn field(&self) -> Option<&str> {
        match self {
            AppError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
    /// `Retry-After`, in seconds, for a refusal that ends by itself.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            AppError::TooMany { retry_after_s, .. } => Some(*retry_after_s),
            _ => None,
        }
    }
    fn log(&self) {
        if let AppError::Internal(e) = self {
            tracing::error!("internal error: {e:#}");
        }
    }
}

/// A broken rule from the shared request rules (`commons_api`), with its field.
impl From<commons_api::Invalid> for AppError {
    fn from(e: commons_api::Invalid) -> Self {
        AppError::invalid(&e.field, e.message)
    }
}

/// What the database layer says, as the status and message users see: the one place a
/// database error becomes HTTP.
impl From<DbError> for AppError {
    fn from(e: DbError) -> Self {
        if e.is_unavailable() {
            tracing::warn!("the database is unavailable: {e}");
            return AppError::Unavailable(
                "the database is unavailable for a moment; try again".into(),
            );
        }
        match e {
            DbError::NotFound(what) => AppError::NotFound(what),
            DbError::Invalid { field, message } => AppError::invalid(&field, message),
            DbError::Conflict { code, message } => AppError::Conflict { code, message },
            DbError::BadCredential(m) => AppError::Unauthenticated(m),
            DbError::TooMany {
                code,
                message,
                retry_after_s,
            } => AppError::TooMany {
                code,
                message,
                retry_after_s,
            },
            DbError::Full(m) => AppError::Unavailable(m),
            e => AppError::Internal(e.into()),
        }
    }
}

/// diesel used directly (a transaction the service layer opens): as the database layer's.
impl From<diesel::result::Error> for AppError {
    fn from(e: diesel::result::Error) -> Self {
        DbError::Query(e).into()
    }
}

#[derive(Serialize)]
pub struct ErrorBody<'a> {
    pub error: &'a str,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<&'a str>,
}

/// An error in the JSON API.
#[derive(Debug, Error)]
#[error(transparent)]
pub struct ApiError(#[from] pub AppError);

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.0.status()
    }
    fn error_response(&self) -> HttpResponse {
        self.0.log();
        let mut res = HttpResponse::build(self.0.status());
        if let Some(s) = self.0.retry_after() {
            res.insert_header(("retry-after", s.to_string()));
        }
        res.json(ErrorBody {
            error: self.0.code(),
            message: self.0.to_string(),
            field: self.0.field(),
        })
    }
}

/// A database error straight from a handler, mapped as everywhere ([`AppError`]'s `From`).
impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        ApiError(e.into())
    }
}

/// An error in the HTML UI.
#[derive(Debug, Error)]
#[error(transparent)]
pub struct WebError(#[from] pub AppError);

impl ResponseError for WebError {
    fn status_code(&self) -> StatusCode {
        self.0.status()
    }
    fn error_response(&self) -> HttpResponse {
        self.0.log();
        if matches!(self.0, AppError::Unauthenticated(_)) {
            return HttpResponse::SeeOther()
                .insert_header(("location", "/login"))
                .finish();
        }
        let page = ErrorPageInfo {
            status: self.0.status().as_u16(),
            message: self.0.to_string(),
        };
        // The body is rendered as a full page, with the user's navigation, by
        // `web::error_pages`; this plain text is what is left should that not run.
        let mut res = HttpResponse::build(self.0.status())
            .content_type("text/plain; charset=utf-8")
            .body(page.message.clone());
        res.extensions_mut().insert(page);
        res
    }
}

/// A database error straight from a handler, mapped as everywhere ([`AppError`]'s `From`).
impl From<DbError> for WebError {
    fn from(e: DbError) -> Self {
        WebError(e.into())
    }
}

/// What an HTML error page says; carried in the response's extensions.
#[derive(Debug, Clone)]
pub struct ErrorPageInfo {
    pub status: u16,
    pub message: String,
}
