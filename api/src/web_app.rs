//! A job that serves a web app (JupyterLab, TensorBoard, ...): the `app` field of a job
//! request. The app listens on the container's own loopback; the portal relays to it
//! through the job's agent and serves it on an origin of its own.

use crate::Invalid;
use serde::{Deserialize, Serialize};

/// `{"port": 8888}`: the app's port on the container's localhost, and how long it may
/// sit idle (`{"port": 8888, "idle_minutes": 60}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AppSpec {
    /// 1024 to 65535 (an app runs as an ordinary user inside the container).
    pub port: i64,
    /// Minutes without a request through the proxy, an open WebSocket or an SSH session
    /// after which the job ends (with a warning on its page first), 1 to 10080. Left
    /// out: no idle limit (the time limit still holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_minutes: Option<i64>,
}

/// The ports an app may use.
pub const APP_PORTS: std::ops::RangeInclusive<i64> = 1024..=65535;
/// The idle limits an app may have, in minutes (a week at most).
pub const IDLE_MINUTES: std::ops::RangeInclusive<i64> = 1..=7 * 24 * 60;

/// Checks the `app` field.
pub fn check(app: &AppSpec) -> Result<(), Invalid> {
    if !APP_PORTS.contains(&app.port) {
        return Err(Invalid::new(
            "app",
            format!(
                "app.port is {}; a web app listens on a port from {} to {} on the container's localhost",
                app.port,
                APP_PORTS.start(),
                APP_PORTS.end()
            ),
        ));
    }
    if let Some(m) = app.idle_minutes {
        if !IDLE_MINUTES.contains(&m) {
            return Err(Invalid::new(
                "app.idle_minutes",
                format!(
                    "app.idle_minutes is {m}; an app's idle limit is {} to {} minutes",
                    IDLE_MINUTES.start(),
                    IDLE_MINUTES.end()
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_outside_the_range_are_refused_naming_the_field() {
        for port in [0, 22, 1023, 65536, -1] {
            let e = check(&AppSpec {
                port,
                idle_minutes: None,
            })
            .unwrap_err();
            assert_eq!(e.field, "app");
            assert!(e.message.contains(&port.to_string()), "{e}");
        }
        for port in [1024, 8888, 65535] {
            let app = AppSpec {
                port,
                idle_minutes: Some(30),
            };
            assert_eq!(check(&app), Ok(()));
        }
    }

    #[test]
    fn idle_limits_outside_the_range_are_refused_naming_the_field() {
        for m in [0, -5, 10081] {
            let app = AppSpec {
                port: 8888,
                idle_minutes: Some(m),
            };
            let e = check(&app).unwrap_err();
            assert_eq!(e.field, "app.idle_minutes", "{e}");
        }
    }
}
