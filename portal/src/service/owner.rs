//! The owner's commands from the server itself (`commons-agent lend|drain|undrain|
//! reclaim|leave|status`, forwarded by the agent with its node credential), the same
//! commands from lab admins on the node's page in the portal, and revoking a node's
//! credential (lab admins, from the portal).
//!
//! Invariants:
//! - A command changes the same settings the lab console changes (lending rules, drain,
//!   reclaim), through the same rules, and is recorded in the lab's audit log in the same
//!   transaction, with the actor "USER on NODE (on the server)".
//! - A revoked node is refused everywhere at once: its credential no longer authenticates
//!   (WebSocket, checkpoints, this API), and a connection that is open on any replica is
//!   closed at its next heartbeat (which [`db::node_link::beat`] counts only for a node
//!   not revoked). Its attempts
//!   are no longer renewed, so they end when their leases run out and are requeued then
//!   (never earlier: a job never runs twice at once).

use super::policy::{lending_rules, LendingRequest, WindowRequest};
use super::{node_admin, Actor, Ctx};
use crate::db::models::{Gpu, Lab, Node, User};
use crate::db::types::to_json;
use crate::db::{self, DbConn};
use crate::error::AppError;
use commons_proto::control::GpuState;
use commons_proto::{NodeCommand, NodeControlAnswer, NodeState};
use commons_sched::{LendMode, Lending};

/// The node as `commons-agent status` shows it.
pub fn state_of(c: &mut DbConn, node: &Node, utc_offset_s: i32) -> Result<NodeState, AppError> {
    let lab = db::users::lab_by_id(c, node.lab_id)?;
    let gpus = db::nodes::gpus_of(c, node.id)?;
    let rules = node.lending_rules();
    let now = db::now();
    let now_s = now.and_utc().timestamp();
    let lending_now = !node.reclaim
        && !node.draining
        && !node.inventory_unapproved
        && rules
            .lend_until(now_s, utc_offset_s)
            .is_some_and(|u| u > now_s);
    let node_why = if node.reclaim {
        Some("the owner took every GPU back (reclaim)".to_string())
    } else if node.draining {
        Some("the server is drained".to_string())
    } else if let Some(low) = &node.disk_low {
        Some(low.clone())
    } else if node.inventory_unapproved {
        Some(
            "the server reports GPUs it did not enrol with; no guests until a lab admin \
             approves them"
                .to_string(),
        )
    } else if !lending_now {
        Some(format!(
            "the lending rule ({}) does not lend now",
            describe(&rules)
        ))
    } else {
        None
    };
    let gpus = gpus
        .into_iter()
        .map(|g| {
            let idle_for = g
                .idle_since
                .map(|t| (now - t).num_seconds())
                .unwrap_or(i64::MAX);
            let why = if let Some(f) = &g.fault {
                format!("withdrawn: faulty ({f})")
            } else if g.local_use {
                "the owner is using it directly".to_string()
            } else if let Some(w) = &node_why {
                w.clone()
            } else if idle_for < rules.min_idle_s {
                format!(
                    "lent once idle {} min (idle {} min so far)",
                    rules.min_idle_s / 60,
                    idle_for / 60
                )
            } else {
                String::new()
            };
            GpuState {
                uuid: g.uuid,
                lendable: why.is_empty(),
                why,
            }
        })
        .collect();
    Ok(NodeState {
        node_id: node.id,
        name: node.name.clone(),
        lab: lab.slug,
        lending: describe(&rules),
        lending_now,
        draining: node.draining,
        reclaim: node.reclaim,
        min_idle_minutes: rules.min_idle_s / 60,
        gpus,
    })
}

/// "always", "never", "windows: Mon-Fri 19:00-07:00, ...".
fn describe(rules: &Lending) -> String {
    match rules.mode {
        LendMode::Never => "never".into(),
        LendMode::Always => "always".into(),
        LendMode::Windows => format!("windows ({} weekly)", rules.windows.len()),
    }
}

/// Applies an owner's command from the server of `node`; the answer says what changed.
pub async fn command(
    ctx: &Ctx,
    node: Node,
    cmd: NodeCommand,
    utc_offset_s: i32,
) -> Result<NodeControlAnswer, AppError> {
    let id = node.id;
    let leaving = matches!(cmd, NodeCommand::Leave { .. });
    let answer = ctx
        .db
        .run(move |c| {
            let who = Issuer::server(&node, &cmd)?;
            let message = db::transaction(c, |c| apply(c, &node, cmd, &who))?;
            let node = db::nodes::node_by_id(c, node.id)?;
            let state = state_of(c, &node, utc_offset_s)?;
            Ok::<_, AppError>(NodeControlAnswer { message, state })
        })
        .await?;
    if leaving {
        ctx.agents.disconnect(id);
    }
    ctx.wake.notify_one();
    Ok(answer)
}

fn by_field(by: &str) -> Result<String, AppError> {
    let by = by.trim();
    if by.is_empty() || by.len() > 64 || by.chars().any(char::is_control) {
        return Err(AppError::invalid(
            "by",
            "a local user name, 1 to 64 characters",
        ));
    }
    Ok(by.to_string())
}

/// Who gave a command, as the audit log names them.
enum Issuer<'a> {
    /// Someone on the server ("USER on NODE (on the server)"), forwarded by the agent.
    Server(String),
    /// A lab admin (or operator) in the portal.
    Admin(&'a User),
}

impl Issuer<'_> {
    fn server(node: &Node, cmd: &NodeCommand) -> Result<Self, AppError> {
        let by = match cmd {
            NodeCommand::Lend { by, .. }
            | NodeCommand::Drain { by }
            | NodeCommand::Undrain { by }
            | NodeCommand::Reclaim { by, .. }
            | NodeCommand::Leave { by } => by,
        };
        Ok(Issuer::Server(format!(
            "{} on {} (on the server)",
            by_field(by)?,
            node.name
        )))
    }

    fn record(
        &self,
        c: &mut DbConn,
        node: &Node,
        action: &str,
        before: &str,
        after: &str,
    ) -> Result<(), AppError> {
        let target = format!("node {}", node.name);
        let lab = Some(node.lab_id);
        let recorded = match self {
            Issuer::Server(actor) => {
                db::audit::record_as(c, actor, lab, action, &target, before, after)
            }
            Issuer::Admin(user) => db::audit::record(c, user, lab, action, &target, before, after),
        };
        Ok(recorded?)
    }
}

/// One command, in the caller's transaction, with its audit entry.
fn apply(c: &mut DbConn, node: &Node, cmd: NodeCommand, who: &Issuer) -> Result<String, AppError> {
    match cmd {
        NodeCommand::Lend { mode, windows, .. } => {
            let req = LendingRequest {
                mode,
                windows: windows
                    .into_iter()
                    .map(|w| WindowRequest {
                        days: w.days,
                        from: w.from,
                        to: w.to,
                    })
                    .collect(),
                max_lent_gpus: None,
                min_idle_minutes: None,
                max_guest_minutes: None,
                borrowers: Vec::new(),
                grace_seconds: None,
                reclaim: false,
                share_gpus: None,
            };
            let (fresh, _, _) = lending_rules(c, req)?;
            // Only the mode and windows change; the lab admin's other limits stay.
            let mut lending = node.lending_rules();
            lending.mode = fresh.mode;
            lending.windows = fresh.windows;
            let json = to_json(&lending).map_err(|e| AppError::Internal(e.into()))?;
            db::nodes::set_lending(c, node.id, &json, node.grace_s, node.reclaim)?;
            let before = describe(&node.lending_rules());
            let after = describe(&lending);
            who.record(c, node, "set_lending", &before, &after)?;
            Ok(format!("lending rule set to {after}"))
        }
        NodeCommand::Drain { .. } => {
            db::nodes::set_draining(c, node.id, true)?;
            who.record(c, node, "drain", &node.draining.to_string(), "true")?;
            Ok("drained: no new jobs; guests are moving elsewhere; owner jobs finish".into())
        }
        NodeCommand::Undrain { .. } => {
            db::nodes::set_draining(c, node.id, false)?;
            who.record(c, node, "undrain", &node.draining.to_string(), "false")?;
            Ok("undrained: the server takes jobs again".into())
        }
        NodeCommand::Reclaim { on, .. } => {
            let json = to_json(&node.lending_rules()).map_err(|e| AppError::Internal(e.into()))?;
            db::nodes::set_lending(c, node.id, &json, node.grace_s, on)?;
            who.record(
                c,
                node,
                "reclaim",
                &node.reclaim.to_string(),
                &on.to_string(),
            )?;
            Ok(if on {
                "every GPU taken back: guests are stopped, nothing is lent".into()
            } else {
                "reclaim ended: the lending rule applies again".into()
            })
        }
        NodeCommand::Leave { .. } => {
            db::nodes::revoke(c, node.id)?;
            who.record(c, node, "leave", "enrolled", "left")?;
            Ok("the server left GPU Commons: its credential is revoked".into())
        }
    }
}

/// The owner's commands from the node's page in the portal: the same rules and effects as
/// from the server, audited as done by the lab admin. Leaving is the server's own act; a
/// lab admin revokes the node instead ([`revoke`]).
pub async fn admin_command(
    ctx: &Ctx,
    actor: &Actor,
    node: i64,
    cmd: NodeCommand,
    utc_offset_s: i32,
) -> Result<NodeControlAnswer, AppError> {
    if matches!(cmd, NodeCommand::Leave { .. }) {
        return Err(AppError::invalid(
            "command",
            "a server leaves by itself (commons-agent leave); revoke its credential instead",
        ));
    }
    let actor = actor.clone();
    let answer = ctx
        .db
        .run(move |c| {
            let (admin, n) = node_admin(c, &actor, node)?;
            if n.revoked_at.is_some() {
                return Err(AppError::NotFound("node"));
            }
            let message =
                db::transaction(c, |c| apply(c, &n, cmd, &Issuer::Admin(admin.user())))?;
            tracing::info!(node, by = %admin.user().username, %message, "owner command from the portal");
            let n = db::nodes::node_by_id(c, node)?;
            let state = state_of(c, &n, utc_offset_s)?;
            Ok::<_, AppError>(NodeControlAnswer { message, state })
        })
        .await?;
    ctx.wake.notify_one();
    Ok(answer)
}

/// A node's page: the node, its lab and GPUs, what is lent and why, and whether `actor`
/// may change it. Revoked nodes are gone (404).
pub struct NodePage {
    pub node: Node,
    pub lab: Lab,
    pub gpus: Vec<Gpu>,
    pub state: NodeState,
    pub can_admin: bool,
    /// The GPUs it enrolled with (or its lab admin last approved), and those it reports
    /// now, in words ("2 × A100-80GB").
    pub approved_gpus: String,
    pub reported_gpus: String,
}

pub fn node_page(
    c: &mut DbConn,
    actor: &Actor,
    node: i64,
    utc_offset_s: i32,
) -> Result<NodePage, AppError> {
    let n = db::nodes::node_by_id(c, node)?;
    if n.revoked_at.is_some() {
        return Err(AppError::NotFound("node"));
    }
    let lab = db::users::lab_by_id(c, n.lab_id)?;
    let gpus = db::nodes::gpus_of(c, n.id)?;
    let state = state_of(c, &n, utc_offset_s)?;
    use super::inventory::{baseline_of, counts_of, describe};
    let approved_gpus = describe(&baseline_of(n.gpu_baseline.as_deref()).unwrap_or_default());
    let reported_gpus = describe(&counts_of(&gpus));
    Ok(NodePage {
        approved_gpus,
        reported_gpus,
        can_admin: actor.admin_of(n.lab_id),
        node: n,
        lab,
        gpus,
        state,
    })
}

/// Revokes a node's credential (its lab's admins or operators): refused from now on, on
/// every replica; its running jobs are requeued when their leases run out.
pub async fn revoke(ctx: &Ctx, actor: &Actor, node: i64) -> Result<(), AppError> {
    let actor = actor.clone();
    ctx.db
        .run(move |c| {
            let (admin, n) = node_admin(c, &actor, node)?;
            if n.revoked_at.is_some() {
                return Err(AppError::NotFound("node"));
            }
            db::transaction(c, |c| {
                db::nodes::revoke(c, node)?;
                db::audit::record(
                    c,
                    admin.user(),
                    Some(n.lab_id),
                    "revoke_node",
                    &format!("node {}", n.name),
                    "enrolled",
                    "revoked",
                )
            })?;
            tracing::info!(node, by = %admin.user().username, "node credential revoked");
            Ok(())
        })
        .await?;
    ctx.agents.disconnect(node);
    ctx.wake.notify_one();
    Ok(())
}
