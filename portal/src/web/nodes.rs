//! The servers page (every node, its owner lab and GPUs) and each node's own page, where
//! its lab's admins have the owner's controls: drain, the lending rule, reclaim, revoke,
//! approving GPUs it did not enrol with, dismissing a shared-credential flag.
//! The controls call the same use cases as `commons-agent drain|lend|reclaim` on the
//! server ([`owner::admin_command`]) and the revoke API ([`owner::revoke`]); each is
//! audited there. Who may use them is decided there too (403 for anyone else).

use super::Banner;
use crate::auth::{CsrfForm, CurrentUser, NoFields};
use crate::db::models::{Gpu, Lab, Node};
use crate::error::{AppError, WebError};
use crate::service::nodes;
use crate::service::owner::{self, NodePage as NodeData};
use crate::state::AppState;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;
use commons_proto::control::{parse_window, GpuState};
use commons_proto::NodeCommand;
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/nodes", web::get().to(page))
        .route("/nodes/{id}", web::get().to(node_page))
        .route("/nodes/{id}/drain", web::post().to(post_drain))
        .route("/nodes/{id}/undrain", web::post().to(post_undrain))
        .route("/nodes/{id}/lend", web::post().to(post_lend))
        .route("/nodes/{id}/reclaim", web::post().to(post_reclaim))
        .route("/nodes/{id}/share", web::post().to(post_share))
        .route("/nodes/{id}/revoke", web::post().to(post_revoke))
        .route(
            "/nodes/{id}/approve-inventory",
            web::post().to(post_approve_inventory),
        )
        .route(
            "/nodes/{id}/dismiss-shared",
            web::post().to(post_dismiss_shared),
        );
}

#[derive(Template, WebTemplate)]
#[template(path = "nodes.html")]
struct NodesPage {
    banner: Banner,
    nodes: Vec<(Node, Lab, Vec<Gpu>)>,
}

async fn page(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<NodesPage, WebError> {
    let nodes = nodes::all(&state).await?;
    Ok(NodesPage {
        banner: Banner::new(&state, &session, Some(&user)),
        nodes,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "node.html")]
struct NodePage {
    banner: Banner,
    d: NodeData,
    /// Each GPU with what the owner's status says about it.
    gpus: Vec<(Gpu, GpuState)>,
    /// The windows, one a line, as the lending form shows them.
    windows_text: String,
}

async fn node_page(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<NodePage, WebError> {
    let banner = Banner::new(&state, &session, Some(&user));
    let offset = state.config.policy.utc_offset_s;
    let id = id.into_inner();
    let mut d = state
        .db
        .run(move |c| owner::node_page(c, &user, id, offset))
        .await?;
    let gpus = std::mem::take(&mut d.gpus)
        .into_iter()
        .map(|g| {
            let st = d
                .state
                .gpus
                .iter()
                .find(|s| s.uuid == g.uuid)
                .cloned()
                .unwrap_or(GpuState {
                    uuid: g.uuid.clone(),
                    lendable: false,
                    why: String::new(),
                });
            (g, st)
        })
        .collect();
    let windows_text = d
        .node
        .lending
        .0
        .windows
        .iter()
        .map(window_text)
        .collect::<Vec<_>>()
        .join("\n");
    Ok(NodePage {
        banner,
        d,
        gpus,
        windows_text,
    })
}

/// A stored window in the form's grammar, e.g. "mon 19:00-07:00".
fn window_text(w: &commons_sched::WeeklyWindow) -> String {
    const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
    let week = commons_sched::WEEK_MINUTES;
    let len = (w.end_minute + week - w.start_minute) % week;
    let from = w.start_minute % 1440;
    let day = DAYS[(w.start_minute / 1440) as usize % 7];
    let hhmm = |m: u32| format!("{:02}:{:02}", m / 60, m % 60);
    let to = if from == 0 && len == 1440 {
        "24:00".to_string()
    } else {
        hhmm((from + len) % 1440)
    };
    format!("{day} {}-{to}", hhmm(from))
}

fn back_to(id: i64) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header(("location", format!("/nodes/{id}")))
        .finish()
}

/// Runs one owner command as the signed-in lab admin and goes back to the node's page.
async fn command(
    state: &AppState,
    user: &CurrentUser,
    id: i64,
    cmd: NodeCommand,
) -> Result<HttpResponse, WebError> {
    let offset = state.config.policy.utc_offset_s;
    owner::admin_command(state, user, id, cmd, offset)
        .await
        .map_err(named)?;
    Ok(back_to(id))
}

/// A refusal of bad input names its field on the error page ("mode: must be ...").
fn named(e: AppError) -> AppError {
    match &e {
        AppError::Invalid {
            code,
            field,
            message,
        } => AppError::invalid_as(code, field, format!("{field}: {message}")),
        _ => e,
    }
}

fn by(user: &CurrentUser) -> String {
    user.user.username.clone()
}

async fn post_drain(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    _form: CsrfForm<NoFields>,
) -> Result<HttpResponse, WebError> {
    let cmd = NodeCommand::Drain { by: by(&user) };
    command(&state, &user, id.into_inner(), cmd).await
}

async fn post_undrain(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    _form: CsrfForm<NoFields>,
) -> Result<HttpResponse, WebError> {
    let cmd = NodeCommand::Undrain { by: by(&user) };
    command(&state, &user, id.into_inner(), cmd).await
}

#[derive(Deserialize)]
struct LendForm {
    mode: String,
    /// One window a line, as `commons-agent lend windows` takes them ("mon-fri 19:00-07:00").
    #[serde(default)]
    windows: String,
}

async fn post_lend(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    form: CsrfForm<LendForm>,
) -> Result<HttpResponse, WebError> {
    let form = form.0;
    let windows = if form.mode == "windows" {
        form.windows
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| parse_window(l).map_err(|e| named(AppError::invalid("windows", e))))
            .collect::<Result<Vec<_>, _>>()?
    } else {
        Vec::new()
    };
    let cmd = NodeCommand::Lend {
        mode: form.mode,
        windows,
        by: by(&user),
    };
    command(&state, &user, id.into_inner(), cmd).await
}

#[derive(Deserialize)]
struct SwitchForm {
    /// "on" or "off" (reclaim: take every GPU back now, or lend again under the rule;
    /// share: let jobs take a fraction of one GPU, or whole GPUs only).
    on: String,
}

/// An on/off switch's value.
fn switch(form: &SwitchForm) -> Result<bool, WebError> {
    match form.on.as_str() {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(named(AppError::invalid("on", "must be on or off")).into()),
    }
}

async fn post_reclaim(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    form: CsrfForm<SwitchForm>,
) -> Result<HttpResponse, WebError> {
    let on = switch(&form.0)?;
    let cmd = NodeCommand::Reclaim { on, by: by(&user) };
    command(&state, &user, id.into_inner(), cmd).await
}

async fn post_share(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    form: CsrfForm<SwitchForm>,
) -> Result<HttpResponse, WebError> {
    let on = switch(&form.0)?;
    let id = id.into_inner();
    crate::service::policy::set_sharing(&state, &user, id, on).await?;
    Ok(back_to(id))
}

async fn post_revoke(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    _form: CsrfForm<NoFields>,
) -> Result<HttpResponse, WebError> {
    owner::revoke(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", "/nodes"))
        .finish())
}

async fn post_approve_inventory(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    _form: CsrfForm<NoFields>,
) -> Result<HttpResponse, WebError> {
    let id = id.into_inner();
    crate::service::inventory::approve(&state, &user, id).await?;
    Ok(back_to(id))
}

async fn post_dismiss_shared(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    _form: CsrfForm<NoFields>,
) -> Result<HttpResponse, WebError> {
    let id = id.into_inner();
    crate::service::inventory::dismiss_shared(&state, &user, id).await?;
    Ok(back_to(id))
}
