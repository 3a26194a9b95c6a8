//! A job that serves a web app (JupyterLab, TensorBoard, ...): the `app` field of a job
//! request. The app listens on the container's own loopback; the portal relays to it
//! through the job's agent and serves it on an origin of its own.

use crate::Invalid;
use serde::{Deserialize, Serialize};

/// `{"port": 8888}`: the app's port on the container's localhost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AppSpec {
    /// 1024 to 65535 (an app runs as an ordinary user inside the container).
    pub port: i64,
}

/// The ports an app may use.
pub const APP_PORTS: std::ops::RangeInclusive<i64> = 1024..=65535;

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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_outside_the_range_are_refused_naming_the_field() {
        for port in [0, 22, 1023, 65536, -1] {
            let e = check(&AppSpec { port }).unwrap_err();
            assert_eq!(e.field, "app");
            assert!(e.message.contains(&port.to_string()), "{e}");
        }
        for port in [1024, 8888, 65535] {
            assert_eq!(check(&AppSpec { port }), Ok(()));
        }
    }
}
