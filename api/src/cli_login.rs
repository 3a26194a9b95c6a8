//! The `commons` CLI's sign-in through the browser (RFC 8628's device authorization
//! grant): `POST /api/v1/cli/device` starts it, `POST /api/v1/cli/token` polls for the
//! token. Both work without a token: they are how the CLI gets one.

use chrono::NaiveDateTime;
use serde::{Deserialize, Serialize};

/// `POST /api/v1/cli/device`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DeviceRequest {
    /// What the computer asking calls itself ("alice@laptop"); it only names the token on
    /// the Tokens page, and is never shown as who asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_name: Option<String>,
}

/// RFC 8628's device authorization response, without `verification_uri_complete`: the
/// user types the code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeviceStart {
    /// What the CLI polls `POST /api/v1/cli/token` with.
    pub device_code: String,
    /// What the user types on the page.
    pub user_code: String,
    pub verification_uri: String,
    /// Seconds until the sign-in expires.
    pub expires_in: i64,
    /// Seconds to wait between polls.
    pub interval: i64,
}

/// `POST /api/v1/cli/token`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    pub device_code: String,
}

/// The token, once the user approved the sign-in (given once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokenGranted {
    /// A personal access token: `Authorization: Bearer TOKEN`.
    pub access_token: String,
    /// Always `Bearer`.
    pub token_type: String,
    pub expires_at: NaiveDateTime,
    pub username: String,
    /// Whether the token may add SSH keys and make more tokens.
    pub can_add_credentials: bool,
}
