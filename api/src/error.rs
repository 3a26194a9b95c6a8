//! What every refusal under `/api/v1` answers: `{"error", "message"}`, and `field` when
//! one field of the request is at fault.

use serde::{Deserialize, Serialize};

/// A refusal. `error` is a stable `snake_case` code (`not_found`, `invalid`,
/// `forbidden`, ...; RFC 8628's codes for `POST /api/v1/cli/token`), `message` says why
/// in words.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
    /// The request's field at fault (422 `invalid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// `slow_down` only: the seconds to wait between polls from now on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<i64>,
}
