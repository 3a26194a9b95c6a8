//! What every handler and background loop shares: the use cases' context plus the
//! configuration and the SSO client.

use crate::config::Config;
use crate::service::Ctx;
use std::sync::Arc;

#[derive(Clone)]
pub struct AppState {
    pub ctx: Ctx,
    pub config: Arc<Config>,
    /// Campus SSO, when configured.
    pub oidc: Option<Arc<crate::auth::oidc::Oidc>>,
}

impl std::ops::Deref for AppState {
    type Target = Ctx;
    fn deref(&self) -> &Ctx {
        &self.ctx
    }
}
