//! `[smtp]` and `[notify]`: how notifications leave the portal.

use serde::Deserialize;

/// The campus SMTP relay. Without this section no e-mail is sent (the settings page
/// says so).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmtpConfig {
    /// lettre's URL syntax: `smtp://host:25` (plain), `smtp://host:587?tls=required`
    /// (STARTTLS), `smtps://host:465` (TLS from the start); credentials as
    /// `smtp://user:password@host:587?tls=required`.
    pub url: String,
    /// The sender, `GPU Commons <gpu@campus.example>`.
    pub from: String,
}

impl std::fmt::Debug for SmtpConfig {
    // The URL may carry the relay's password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut url = url::Url::parse(&self.url).ok();
        if let Some(u) = url.as_mut().filter(|u| u.password().is_some()) {
            let _ = u.set_password(Some("(hidden)"));
        }
        f.debug_struct("SmtpConfig")
            .field("url", &url.map(|u| u.to_string()))
            .field("from", &self.from)
            .finish()
    }
}

/// Delivery of notifications.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotifyConfig {
    /// Allow webhooks to loopback, private (RFC 1918, fc00::/7) and link-local
    /// addresses. Off: such targets are refused when saved and when sent to.
    pub allow_private_targets: bool,
    /// How often the sender looks for new job events and due deliveries, in ms.
    pub poll_ms: u64,
    /// The first retry's delay in seconds; each next one doubles it (at most an hour).
    pub retry_base_s: u64,
    /// How long a delivery is retried before it is given up, in hours.
    pub retry_hours: u64,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        Self {
            allow_private_targets: false,
            poll_ms: 500,
            retry_base_s: 10,
            retry_hours: 24,
        }
    }
}
