//! Use cases: each thing a user, a lab admin, an operator or an agent can do, written
//! once, called by the JSON API, the HTML UI and the broker alike. Rules, transactions
//! and audit entries live here; SQL lives in `db/`; HTTP lives in `api/` and `web/`.
//!
//! Invariants:
//! - Every use case on a lab's settings goes through [`lab_admin`] or [`node_admin`],
//!   which return the [`LabAdmin`] proof the use case then needs: no handler can skip
//!   the check, because there is nothing to call without it.
//! - Jobs a caller may not see answer "not found", never "forbidden" (which would tell
//!   that the id exists).

pub mod account;
pub mod agent_link;
pub mod agents;
pub mod app_idle;
pub mod app_presets;
pub mod apps;
pub mod arrays;
pub mod attempts;
pub mod checkpoints;
pub mod cli_login;
pub mod datasets;
pub mod deps;
pub mod extend;
pub mod files;
pub mod identity;
pub mod images;
pub mod inventory;
pub mod job_list;
pub mod job_templates;
pub mod jobs;
pub mod labs;
pub mod members;
pub mod metrics;
pub mod nodes;
pub mod notify;
pub mod output;
pub mod overview;
pub mod owner;
pub mod plan_commit;
pub mod policy;
pub mod relays;
pub mod reports;
pub mod round;
pub mod samples;
pub mod sessions;
pub mod ssh;
pub mod ssh_keys;
#[cfg(test)]
pub(crate) mod testkit;
pub mod tokens;
pub mod utilization;
pub mod views;

use crate::db::models::{Job, Lab, Node, Role, User};
use crate::db::{self, Db, DbConn};
use crate::error::AppError;
use std::sync::Arc;
use tokio::sync::Notify;

/// What use cases work with: the database, the scheduler's wake-up, the agents this
/// replica holds. (`AppState`, the HTTP layer's state, derefs to it.)
#[derive(Clone)]
pub struct Ctx {
    pub db: Db,
    /// Wakes the scheduler early (a job was submitted, GPUs were freed).
    pub wake: Arc<Notify>,
    /// Connected agents, by node id.
    pub agents: agents::Registry,
    /// Where checkpoint archives are kept.
    pub checkpoints: checkpoints::Store,
    /// Users' and labs' file spaces (in the same store) and their default quotas.
    pub files: files::Files,
    /// SSH relays this replica asked agents for.
    pub relays: relays::Hub,
    /// This process's Prometheus metrics.
    pub metrics: crate::metrics::SharedMetrics,
    /// The campus image authorities' keys (allow-list signatures).
    pub image_authorities: images::Authorities,
    /// Where jobs' web apps are served (`[apps]`).
    pub apps: Arc<crate::config::AppsConfig>,
}

/// Who is asking: a signed-in user and their labs. `auth::CurrentUser` is the HTTP
/// extractor that produces one.
#[derive(Debug, Clone)]
pub struct Actor {
    pub user: User,
    pub labs: Vec<(Lab, Role)>,
}

impl Actor {
    /// Does this user administer `lab` (its lab admin, or an operator)? For showing
    /// links; decisions go through [`lab_admin`].
    pub fn admin_of(&self, lab: i64) -> bool {
        self.user.is_operator
            || self
                .labs
                .iter()
                .any(|(l, r)| l.id == lab && *r == Role::Admin)
    }

    /// Refuses unless the user is an operator.
    pub fn require_operator(&self) -> Result<(), AppError> {
        if self.user.is_operator {
            Ok(())
        } else {
            Err(AppError::Forbidden("only operators may do this".into()))
        }
    }

    /// (slug, id) of the user's labs, for validation.
    pub fn lab_ids(&self) -> Vec<(String, i64)> {
        self.labs
            .iter()
            .map(|(l, _)| (l.slug.clone(), l.id))
            .collect()
    }

    /// May this user see `job`: their own, or any job for an operator.
    /// Its own jobs, its lab's jobs for a lab admin, every job for an operator.
    pub fn may_see(&self, job: &Job) -> bool {
        job.user_id == self.user.id || self.admin_of(job.lab_id)
    }
}

/// Proof that `actor` administers `lab` (its admin, or an operator). Only [`lab_admin`]
/// and [`node_admin`] make one.
#[derive(Debug, Clone)]
pub struct LabAdmin {
    actor: Actor,
    lab: Lab,
}

impl LabAdmin {
    pub fn actor(&self) -> &Actor {
        &self.actor
    }
    pub fn lab(&self) -> &Lab {
        &self.lab
    }
    pub fn user(&self) -> &User {
        &self.actor.user
    }
}

fn admit(actor: &Actor, lab: Lab) -> Result<LabAdmin, AppError> {
    if actor.admin_of(lab.id) {
        Ok(LabAdmin {
            actor: actor.clone(),
            lab,
        })
    } else {
        Err(AppError::Forbidden(
            "only the lab's admins (or operators) may do this".into(),
        ))
    }
}

/// The lab named `slug`, if `actor` administers it: 404 for an unknown lab, 403 for a
/// lab the actor does not administer.
pub fn lab_admin(c: &mut DbConn, actor: &Actor, slug: &str) -> Result<LabAdmin, AppError> {
    let lab = db::users::find_lab(c, slug)?.ok_or(AppError::NotFound("lab"))?;
    admit(actor, lab)
}

/// The node `id` and its lab, if `actor` administers that lab.
pub fn node_admin(c: &mut DbConn, actor: &Actor, id: i64) -> Result<(LabAdmin, Node), AppError> {
    let node = db::nodes::node_by_id(c, id)?;
    let lab = db::users::lab_by_id(c, node.lab_id)?;
    Ok((admit(actor, lab)?, node))
}
