//! What every handler and background loop shares.

use crate::broker::Registry;
use crate::config::Config;
use crate::db::Db;
use std::sync::Arc;
use tokio::sync::Notify;

#[derive(Clone)]
pub struct AppState {
    pub db: Db,
    pub config: Arc<Config>,
    /// Connected agents, by node id.
    pub agents: Registry,
    /// Wakes the scheduler early (a job was submitted, GPUs were freed).
    pub wake: Arc<Notify>,
    /// Campus SSO, when configured.
    pub oidc: Option<Arc<crate::auth::oidc::Oidc>>,
}
