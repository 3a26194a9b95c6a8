//! The lab admin's page: lending rules of the lab's servers, quotas of its members, and
//! the lab's own quota (editable by operators). Role-checked through `CurrentUser`.

use super::{optional, Banner, CsrfForm};
use crate::auth::{check_csrf, CurrentUser};
use crate::db::audit::AuditEntry;
use crate::db::models::{Lab, Node, Role};
use crate::db::schema::{memberships, nodes, users as users_t};
use crate::db::users;
use crate::error::{AppError, WebError};
use crate::policy::{self, LendingRequest, QuotaRequest, WindowRequest};
use crate::state::AppState;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;
use commons_sched::{LendMode, Quota};
use diesel::prelude::*;
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/labs/{slug}/admin", web::get().to(page))
        .route("/audit", web::get().to(audit_page))
        .route("/labs/{slug}/members", web::post().to(post_member))
        .route(
            "/labs/{slug}/members/{username}/remove",
            web::post().to(post_remove_member),
        )
        .route(
            "/labs/{slug}/nodes/{id}/lending",
            web::post().to(post_lending),
        )
        .route("/labs/{slug}/quota", web::post().to(post_lab_quota))
        .route(
            "/labs/{slug}/member-default-quota",
            web::post().to(post_member_default_quota),
        )
        .route("/labs/{slug}/enrol-token", web::post().to(post_enrol_token))
        .route(
            "/labs/{slug}/members/{username}/quota",
            web::post().to(post_member_quota),
        );
}

/// One server as the form shows it.
struct NodeRow {
    node: Node,
    preset: &'static str,
    lending: commons_sched::Lending,
    borrowers: String,
}

struct MemberRow {
    username: String,
    role: String,
    source: String,
    quota: Quota,
}

#[derive(Template, WebTemplate)]
#[template(path = "lab_admin.html")]
struct LabAdminPage {
    banner: Banner,
    lab: Lab,
    lab_quota: Quota,
    operator: bool,
    nodes: Vec<NodeRow>,
    members: Vec<MemberRow>,
    audit: Vec<AuditEntry>,
    usage: crate::db::usage::LabUsage,
    member_default: Quota,
    /// A just-made enrolment token and the command that uses it (shown once).
    enrol: Option<(String, String)>,
    error: Option<String>,
}

#[derive(Template, WebTemplate)]
#[template(path = "audit.html")]
struct AuditPage {
    banner: Banner,
    audit: Vec<AuditEntry>,
}

/// Operators read the whole audit log here; lab admins read their lab's on its page.
async fn audit_page(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<AuditPage, WebError> {
    user.require_operator()?;
    let banner = Banner::new(&state, &session, Some(&user));
    let audit = state
        .db
        .run(|c| crate::db::audit::list(c, None, 500))
        .await?;
    Ok(AuditPage { banner, audit })
}

const NIGHTS: (u32, u32) = (19 * 60, 7 * 60);

/// Which form preset the stored windows are.
fn preset(l: &commons_sched::Lending) -> &'static str {
    match l.mode {
        LendMode::Never => "never",
        LendMode::Always => "always",
        LendMode::Windows => {
            let has_nights = l.windows.iter().any(|w| w.start_minute % 1440 == NIGHTS.0);
            let has_weekend = l
                .windows
                .iter()
                .any(|w| w.start_minute == 5 * 1440 && w.end_minute == 6 * 1440);
            match (has_nights, has_weekend) {
                (true, true) => "nights_weekends",
                (true, false) => "nights",
                _ => "weekends",
            }
        }
    }
}

async fn load(
    state: &AppState,
    session: &Session,
    user: CurrentUser,
    slug: String,
    error: Option<String>,
) -> Result<LabAdminPage, WebError> {
    let banner = Banner::new(state, session, Some(&user));
    let operator = user.user.is_operator;
    let page = state
        .db
        .run(move |c| {
            let lab = users::lab_by_slug(c, &slug).map_err(|_| AppError::NotFound("lab"))?;
            user.require_admin_of(lab.id)?;
            let lab_nodes: Vec<Node> = nodes::table
                .filter(nodes::lab_id.eq(lab.id))
                .filter(nodes::revoked_at.is_null())
                .order(nodes::id)
                .select(Node::as_select())
                .load(c)?;
            let all_labs: Vec<(i64, String)> = crate::db::schema::labs::table
                .select((crate::db::schema::labs::id, crate::db::schema::labs::slug))
                .load(c)?;
            let nodes = lab_nodes
                .into_iter()
                .map(|node| {
                    let lending = node.lending_rules();
                    let borrowers = lending
                        .borrowers
                        .iter()
                        .filter_map(|id| {
                            all_labs
                                .iter()
                                .find(|(l, _)| l == id)
                                .map(|(_, s)| s.clone())
                        })
                        .collect::<Vec<_>>()
                        .join(", ");
                    NodeRow {
                        preset: preset(&lending),
                        lending,
                        borrowers,
                        node,
                    }
                })
                .collect();
            let members: Vec<(String, String, String, String)> = memberships::table
                .inner_join(users_t::table)
                .filter(memberships::lab_id.eq(lab.id))
                .order(users_t::username)
                .select((
                    users_t::username,
                    memberships::role,
                    memberships::quota,
                    memberships::source,
                ))
                .load(c)?;
            let members = members
                .into_iter()
                .map(|(username, role, q, source)| MemberRow {
                    username,
                    role: Role::parse(&role).as_str().to_string(),
                    source,
                    quota: serde_json::from_str(&q).unwrap_or_default(),
                })
                .collect();
            let audit = crate::db::audit::list(c, Some(lab.id), 100)?;
            let usage = crate::db::usage::lab_usage(c, lab.id, crate::db::now(), 6)?;
            let lab_quota = serde_json::from_str(&lab.quota).unwrap_or_default();
            let member_default = serde_json::from_str(&lab.member_quota).unwrap_or_default();
            Ok::<_, AppError>(LabAdminPage {
                banner,
                lab,
                lab_quota,
                operator,
                nodes,
                members,
                audit,
                usage,
                member_default,
                enrol: None,
                error,
            })
        })
        .await?;
    Ok(page)
}

async fn page(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    slug: web::Path<String>,
) -> Result<LabAdminPage, WebError> {
    load(&state, &session, user, slug.into_inner(), None).await
}

/// A refused change shows the page again with the reason (HTTP 422).
async fn outcome(
    state: &AppState,
    session: &Session,
    user: CurrentUser,
    slug: String,
    result: Result<(), AppError>,
) -> Result<HttpResponse, WebError> {
    match result {
        Ok(()) => Ok(HttpResponse::SeeOther()
            .insert_header(("location", format!("/labs/{slug}/admin")))
            .finish()),
        Err(e @ AppError::Invalid { .. }) => {
            let msg = format!("{}: {e}", e.field().unwrap_or_default());
            let page = load(state, session, user, slug, Some(msg)).await?;
            let body = page.render().map_err(|e| AppError::Internal(e.into()))?;
            Ok(HttpResponse::UnprocessableEntity()
                .content_type("text/html; charset=utf-8")
                .body(body))
        }
        Err(e) => Err(e.into()),
    }
}

#[derive(Deserialize)]
struct LendingForm {
    #[serde(default)]
    csrf: String,
    mode: String,
    #[serde(default)]
    max_lent_gpus: String,
    #[serde(default)]
    min_idle_minutes: String,
    #[serde(default)]
    max_guest_minutes: String,
    #[serde(default)]
    borrowers: String,
    #[serde(default)]
    grace_seconds: String,
    #[serde(default)]
    reclaim: Option<String>,
}

impl LendingForm {
    fn to_request(&self) -> Result<LendingRequest, AppError> {
        let every_day: Vec<u32> = (0..7).collect();
        let nights = WindowRequest {
            days: every_day,
            from: "19:00".into(),
            to: "07:00".into(),
        };
        let weekends = WindowRequest {
            days: vec![5, 6],
            from: "00:00".into(),
            to: "24:00".into(),
        };
        let (mode, windows) = match self.mode.as_str() {
            "never" | "always" => (self.mode.clone(), vec![]),
            "nights" => ("windows".into(), vec![nights]),
            "weekends" => ("windows".into(), vec![weekends]),
            "nights_weekends" => ("windows".into(), vec![nights, weekends]),
            _ => return Err(AppError::invalid("mode", "pick one of the lending choices")),
        };
        Ok(LendingRequest {
            mode,
            windows,
            max_lent_gpus: optional("max_lent_gpus", &self.max_lent_gpus)?,
            min_idle_minutes: optional("min_idle_minutes", &self.min_idle_minutes)?,
            max_guest_minutes: optional("max_guest_minutes", &self.max_guest_minutes)?,
            borrowers: self
                .borrowers
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            grace_seconds: optional("grace_seconds", &self.grace_seconds)?,
            reclaim: self.reclaim.is_some(),
        })
    }
}

async fn post_lending(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    path: web::Path<(String, i64)>,
    form: web::Form<LendingForm>,
) -> Result<HttpResponse, WebError> {
    check_csrf(&session, &form.csrf)?;
    let (slug, node) = path.into_inner();
    let result = match form.to_request() {
        Ok(req) => policy::set_lending(&state, user.clone(), node, req)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    outcome(&state, &session, user, slug, result).await
}

#[derive(Deserialize)]
struct QuotaForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    max_gpus: String,
    #[serde(default)]
    max_gpu_hours: String,
    #[serde(default)]
    max_job_minutes: String,
}

impl QuotaForm {
    fn to_request(&self) -> Result<QuotaRequest, AppError> {
        Ok(QuotaRequest {
            max_gpus: optional("max_gpus", &self.max_gpus)?,
            max_gpu_hours: optional("max_gpu_hours", &self.max_gpu_hours)?,
            max_job_minutes: optional("max_job_minutes", &self.max_job_minutes)?,
        })
    }
}

async fn post_lab_quota(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    slug: web::Path<String>,
    form: web::Form<QuotaForm>,
) -> Result<HttpResponse, WebError> {
    check_csrf(&session, &form.csrf)?;
    let slug = slug.into_inner();
    let result = match form.to_request() {
        Ok(req) => policy::set_lab_quota(&state, user.clone(), slug.clone(), req)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    outcome(&state, &session, user, slug, result).await
}

async fn post_member_quota(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    path: web::Path<(String, String)>,
    form: web::Form<QuotaForm>,
) -> Result<HttpResponse, WebError> {
    check_csrf(&session, &form.csrf)?;
    let (slug, username) = path.into_inner();
    let result = match form.to_request() {
        Ok(req) => policy::set_member_quota(&state, user.clone(), slug.clone(), username, req)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    outcome(&state, &session, user, slug, result).await
}

#[derive(Deserialize)]
struct MemberForm {
    #[serde(default)]
    csrf: String,
    member: String,
    #[serde(default)]
    role: String,
}

/// Adds a member or changes a member's role.
async fn post_member(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    slug: web::Path<String>,
    form: web::Form<MemberForm>,
) -> Result<HttpResponse, WebError> {
    check_csrf(&session, &form.csrf)?;
    let slug = slug.into_inner();
    let role = match form.role.as_str() {
        "admin" => Role::Admin,
        _ => Role::Member,
    };
    let result = crate::members::set_member(
        &state,
        user.clone(),
        slug.clone(),
        form.member.clone(),
        role,
    )
    .await;
    outcome(&state, &session, user, slug, result).await
}

async fn post_remove_member(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    path: web::Path<(String, String)>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, WebError> {
    check_csrf(&session, &form.csrf)?;
    let (slug, username) = path.into_inner();
    let result = crate::members::remove_member(&state, user.clone(), slug.clone(), username).await;
    outcome(&state, &session, user, slug, result).await
}

async fn post_member_default_quota(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    slug: web::Path<String>,
    form: web::Form<QuotaForm>,
) -> Result<HttpResponse, WebError> {
    check_csrf(&session, &form.csrf)?;
    let slug = slug.into_inner();
    let result = match form.to_request() {
        Ok(req) => policy::set_member_default_quota(&state, user.clone(), slug.clone(), req)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    outcome(&state, &session, user, slug, result).await
}

/// Makes an enrolment token and shows it once, with the agent's command line.
async fn post_enrol_token(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    slug: web::Path<String>,
    form: web::Form<CsrfForm>,
    req: actix_web::HttpRequest,
) -> Result<HttpResponse, WebError> {
    check_csrf(&session, &form.csrf)?;
    let slug = slug.into_inner();
    let token = policy::create_enrol_token(&state, user.clone(), slug.clone()).await?;
    let portal = state.config.public_url.clone().unwrap_or_else(|| {
        let info = req.connection_info();
        format!("{}://{}", info.scheme(), info.host())
    });
    let command = format!(
        "commons-agent run --portal {portal} --enrol-token {token} --state-dir /var/lib/commons-agent --gpus auto"
    );
    let mut page = load(&state, &session, user, slug, None).await?;
    page.enrol = Some((token, command));
    let body = page.render().map_err(|e| AppError::Internal(e.into()))?;
    Ok(HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header(("cache-control", "no-store"))
        .body(body))
}
