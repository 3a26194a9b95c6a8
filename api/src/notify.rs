//! Notifications: the events a user can hear about, their settings
//! (`/api/v1/me/notifications`), a job's own `notify` list, and the delivery log.
//!
//! Invariants: event names are checked here for the portal and the CLI alike; a
//! webhook's secret is write-only (answers carry only its last characters).

use crate::Invalid;
use serde::{Deserialize, Serialize};

/// The events, in the order a job meets them: `ending` is an interactive job or app
/// about to reach its time limit; `array_finished` the one message for an array whose
/// last task ended (its tasks send none of their own).
pub const EVENTS: [&str; 7] = [
    "started",
    "preempted",
    "ending",
    "succeeded",
    "failed",
    "cancelled",
    "array_finished",
];

/// Short names a job's `notify` list may use, Slurm's `--mail-type` style: `start`,
/// `end` (any of succeeded, failed, cancelled, and an array finished), `fail`, `all`.
pub const ALIASES: [(&str, &[&str]); 4] = [
    ("start", &["started"]),
    (
        "end",
        &["succeeded", "failed", "cancelled", "array_finished"],
    ),
    ("fail", &["failed"]),
    ("all", &EVENTS),
];

/// The most webhooks a user may have.
pub const MAX_WEBHOOKS: usize = 5;

/// Expands a list of event names and aliases into event names (sorted, no repeats), or
/// says which name is unknown, naming `field`.
pub fn events(field: &str, names: &[String]) -> Result<Vec<String>, Invalid> {
    let mut out: Vec<String> = Vec::new();
    for n in names {
        let n = n.trim().to_ascii_lowercase();
        let expanded: Vec<&str> = if let Some(e) = EVENTS.iter().find(|e| **e == n) {
            vec![e]
        } else if let Some((_, es)) = ALIASES.iter().find(|(a, _)| *a == n) {
            es.to_vec()
        } else {
            return Err(Invalid::new(
                field,
                format!(
                    "unknown event {n:?}: use {} (or start, end, fail, all)",
                    EVENTS.join(", ")
                ),
            ));
        };
        out.extend(expanded.into_iter().map(str::to_string));
    }
    out.sort_by_key(|e| EVENTS.iter().position(|x| x == e));
    out.dedup();
    Ok(out)
}

/// One webhook as sent: its URL and its secret (`whsec_<base64>`, or any text of at
/// least 16 bytes). Leaving the secret out keeps the one saved for the same URL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WebhookRequest {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// `PUT /api/v1/me/notifications`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NotificationRequest {
    /// E-mail to the address the campus sign-in gave.
    #[serde(default)]
    pub email: bool,
    /// At most 5; http or https, not on private, loopback or link-local addresses
    /// (unless the operator allows them).
    #[serde(default)]
    pub webhooks: Vec<WebhookRequest>,
    /// Which events to send (`started`, `preempted`, `ending`, `succeeded`, `failed`,
    /// `cancelled`, `array_finished`); left out: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<String>>,
}

/// A saved webhook; the secret is shown by its last characters only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookView {
    pub id: String,
    pub url: String,
    /// `…` and the secret's last 4 characters.
    pub secret_hint: String,
}

/// `GET /api/v1/me/notifications`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NotificationSettings {
    pub email: bool,
    /// Where e-mail goes (the sign-in's address).
    pub email_address: String,
    /// False when the portal has no SMTP relay configured: no e-mail is sent.
    pub email_available: bool,
    pub webhooks: Vec<WebhookView>,
    /// Null: every event.
    pub events: Option<Vec<String>>,
}

/// One delivery (an event to one channel) and how its last attempt went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Delivery {
    /// The event's id, the same on every retry (`webhook-id`).
    pub event_id: String,
    pub job: i64,
    /// `started`, `preempted`, ... (for `array_finished`, `job` is the array's first
    /// task)
    pub event: String,
    /// `email` or `webhook`.
    pub channel: String,
    /// The address or the webhook's URL.
    pub target: String,
    /// `pending` (will be retried), `sent` or `failed` (gave up after 24 h).
    pub status: String,
    pub attempts: i32,
    pub created_at: chrono::NaiveDateTime,
    pub last_at: Option<chrono::NaiveDateTime>,
    /// The receiver's answer (`200 OK`, `500 ...`, a connection error).
    pub last_answer: Option<String>,
    /// When a pending delivery is tried next.
    pub next_at: Option<chrono::NaiveDateTime>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_expand_and_unknown_names_name_the_field() {
        let got = events("notify", &["end".into(), "fail".into()]).unwrap();
        assert_eq!(got, ["succeeded", "failed", "cancelled", "array_finished"]);
        assert_eq!(events("notify", &["all".into()]).unwrap(), EVENTS);
        let e = events("notify", &["finish".into()]).unwrap_err();
        assert_eq!(e.field, "notify");
        assert!(e.message.contains("finish"), "{}", e.message);
    }
}
