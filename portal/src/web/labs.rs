//! The lab admin's page: lending rules of the lab's servers, quotas of its members, and
//! the lab's own quota (editable by operators). Role-checked through `CurrentUser`.

use super::{optional, Banner};
use crate::auth::{CsrfForm, CurrentUser, NoFields};
use crate::db::models::{Lab, Role};
use crate::domain::MembershipSource;
use crate::error::{AppError, WebError};
use crate::service::labs::AuditEntry;
use crate::service::labs::{self, MemberRow, NodeRow};
use crate::service::members;
use crate::service::policy::{
    self, LabQuota, LendingRequest, QuotaRequest, WindowRequest, Windows,
};
use crate::state::AppState;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;
use commons_sched::Quota;
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
        .route("/labs/{slug}/interactive", web::post().to(post_interactive))
        .route(
            "/labs/{slug}/members/{username}/quota",
            web::post().to(post_member_quota),
        )
        .route(
            "/labs/{slug}/member-quotas",
            web::post().to(post_member_quotas),
        )
        .route("/labs/{slug}/usage.csv", web::get().to(usage_csv));
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
    usage: crate::service::labs::LabUsage,
    member_default: Quota,
    /// The grace period a node without its own gets.
    default_grace_s: u32,
    /// The usage chart (inline SVG) and its legend.
    chart: String,
    legend: Vec<(&'static str, &'static str)>,
    /// A just-made enrolment token and the command that uses it (shown once).
    enrol: Option<(String, String)>,
    error: Option<String>,
}

impl LabAdminPage {
    /// Hours as people read them.
    fn hours(&self, h: &f64) -> String {
        super::human::hours(*h)
    }

    /// A member's GPUs in use against their limit (their own, else the lab default).
    fn gpu_use(&self, m: &MemberRow) -> super::charts::UseBar {
        let limit = m.quota.max_gpus.or(self.member_default.max_gpus);
        super::charts::UseBar::gpus(
            format!("{} in use", m.gpus_now),
            m.gpus_now as f64,
            limit.map(f64::from),
        )
    }

    /// A member's GPU-hours over 7 days against their limit.
    fn hours_use(&self, m: &MemberRow) -> super::charts::UseBar {
        let limit = m.quota.max_gpu_hours.or(self.member_default.max_gpu_hours);
        super::charts::UseBar::hours(
            format!("{} used", super::human::hours(m.gpu_hours)),
            m.gpu_hours,
            limit,
        )
    }
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
    let audit = crate::service::labs::campus_audit(&state, &user).await?;
    let banner = Banner::new(&state, &session, Some(&user));
    Ok(AuditPage { banner, audit })
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
    let console = state
        .db
        .run(move |c| labs::console(c, &user, &slug))
        .await?;
    Ok(LabAdminPage {
        banner,
        lab_quota: console.lab.quota.0.clone(),
        member_default: console.lab.member_quota.0.clone(),
        lab: console.lab,
        operator,
        nodes: console.nodes,
        members: console.members,
        audit: console.audit,
        chart: super::charts::usage_svg(&console.usage.weeks),
        legend: super::charts::usage_legend(),
        usage: console.usage,
        default_grace_s: state.config.policy.default_grace_s,
        enrol: None,
        error,
    })
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

fn hhmm(minute: u32) -> String {
    format!("{:02}:{:02}", minute / 60, minute % 60)
}

impl LendingForm {
    /// The form as the API's request, and whether it keeps the stored windows.
    fn to_request(&self) -> Result<(LendingRequest, Windows), AppError> {
        let (mode, windows, keep) = match self.mode.as_str() {
            "never" | "always" => (self.mode.clone(), vec![], Windows::Given),
            "custom" => ("windows".into(), vec![], Windows::Keep),
            preset => {
                let windows = labs::preset_windows(preset)
                    .ok_or_else(|| AppError::invalid("mode", "pick one of the lending choices"))?;
                let windows = windows
                    .into_iter()
                    .map(|(days, from, to)| WindowRequest {
                        days: days.to_vec(),
                        from: hhmm(from),
                        to: if to == 0 { "24:00".into() } else { hhmm(to) },
                    })
                    .collect();
                ("windows".into(), windows, Windows::Given)
            }
        };
        let req = LendingRequest {
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
            // The node page's switch sets it; this form leaves it as it is.
            share_gpus: None,
        };
        Ok((req, keep))
    }
}

async fn post_lending(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    path: web::Path<(String, i64)>,
    form: CsrfForm<LendingForm>,
) -> Result<HttpResponse, WebError> {
    let (slug, node) = path.into_inner();
    let result = match form.0.to_request() {
        Ok((req, windows)) => policy::set_lending(&state, &user, node, req, windows)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    outcome(&state, &session, user, slug, result).await
}

#[derive(Deserialize)]
struct QuotaForm {
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
    form: CsrfForm<QuotaForm>,
) -> Result<HttpResponse, WebError> {
    let slug = slug.into_inner();
    let result = match form.0.to_request() {
        Ok(req) => policy::set_lab_quota(&state, &user, slug.clone(), req, LabQuota::Borrowing)
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
    form: CsrfForm<QuotaForm>,
) -> Result<HttpResponse, WebError> {
    let (slug, username) = path.into_inner();
    let result = match form.0.to_request() {
        Ok(req) => policy::set_member_quota(&state, &user, slug.clone(), username, req)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    outcome(&state, &session, user, slug, result).await
}

#[derive(Deserialize)]
struct MemberForm {
    member: String,
    #[serde(default = "member")]
    role: String,
}

fn member() -> String {
    Role::Member.as_str().into()
}

/// Adds a member or changes a member's role.
async fn post_member(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    slug: web::Path<String>,
    form: CsrfForm<MemberForm>,
) -> Result<HttpResponse, WebError> {
    let slug = slug.into_inner();
    let result = match form.0.role.parse::<Role>() {
        Ok(role) => members::set_member(&state, &user, slug.clone(), form.0.member, role).await,
        Err(e) => Err(AppError::invalid("role", e.to_string())),
    };
    outcome(&state, &session, user, slug, result).await
}

async fn post_remove_member(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    path: web::Path<(String, String)>,
    _form: CsrfForm<NoFields>,
) -> Result<HttpResponse, WebError> {
    let (slug, username) = path.into_inner();
    let result = members::remove_member(&state, &user, slug.clone(), username).await;
    outcome(&state, &session, user, slug, result).await
}

async fn post_member_default_quota(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    slug: web::Path<String>,
    form: CsrfForm<QuotaForm>,
) -> Result<HttpResponse, WebError> {
    let slug = slug.into_inner();
    let result = match form.0.to_request() {
        Ok(req) => policy::set_lab_quota(&state, &user, slug.clone(), req, LabQuota::MemberDefault)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    outcome(&state, &session, user, slug, result).await
}

#[derive(Deserialize)]
struct InteractiveForm {
    /// A checkbox: present when ticked.
    #[serde(default)]
    interactive_boost: Option<String>,
}

async fn post_interactive(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    slug: web::Path<String>,
    form: CsrfForm<InteractiveForm>,
) -> Result<HttpResponse, WebError> {
    let slug = slug.into_inner();
    let on = form.0.interactive_boost.is_some();
    let result = policy::set_interactive_boost(&state, &user, slug.clone(), on)
        .await
        .map(|_| ());
    outcome(&state, &session, user, slug, result).await
}

/// Makes an enrolment token and shows it once, with the agent's command line.
async fn post_enrol_token(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    slug: web::Path<String>,
    _form: CsrfForm<NoFields>,
    req: actix_web::HttpRequest,
) -> Result<HttpResponse, WebError> {
    let slug = slug.into_inner();
    let token = policy::create_enrol_token(&state, &user, slug.clone()).await?;
    let portal = state.config.public_url.clone().unwrap_or_else(|| {
        let info = req.connection_info();
        format!("{}://{}", info.scheme(), info.host())
    });
    let command = format!(
        "commons-agent run --portal {portal} --enrol-token {token} --state-dir /var/lib/gpu-commons/agent --gpus auto"
    );
    let mut page = load(&state, &session, user, slug, None).await?;
    page.enrol = Some((token, command));
    let body = page.render().map_err(|e| AppError::Internal(e.into()))?;
    Ok(HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header(("cache-control", "no-store"))
        .body(body))
}

/// The members table's one Save: fields `max_gpus:USER`, `max_gpu_hours:USER`,
/// `max_job_minutes:USER` for each member shown.
async fn post_member_quotas(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    slug: web::Path<String>,
    form: CsrfForm<std::collections::BTreeMap<String, String>>,
) -> Result<HttpResponse, WebError> {
    let slug = slug.into_inner();
    let result = match member_quota_requests(&form.0) {
        Ok(reqs) => policy::set_member_quotas(&state, &user, slug.clone(), reqs)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    outcome(&state, &session, user, slug, result).await
}

/// The members' quota requests from the table's fields; a field of another name, or
/// a number that is none, is refused naming it.
fn member_quota_requests(
    fields: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<(String, QuotaRequest)>, AppError> {
    let mut by_member: std::collections::BTreeMap<&str, QuotaForm> = Default::default();
    for (name, value) in fields {
        let (field, member) = name
            .split_once(':')
            .filter(|(_, m)| !m.is_empty())
            .ok_or_else(|| AppError::invalid(name, "not a field of the members table"))?;
        let q = by_member.entry(member).or_insert_with(|| QuotaForm {
            max_gpus: String::new(),
            max_gpu_hours: String::new(),
            max_job_minutes: String::new(),
        });
        match field {
            "max_gpus" => q.max_gpus = value.clone(),
            "max_gpu_hours" => q.max_gpu_hours = value.clone(),
            "max_job_minutes" => q.max_job_minutes = value.clone(),
            _ => return Err(AppError::invalid(name, "not a field of the members table")),
        }
    }
    by_member
        .into_iter()
        .map(|(member, q)| {
            let req = QuotaRequest {
                max_gpus: optional(&format!("max_gpus:{member}"), &q.max_gpus)?,
                max_gpu_hours: optional(&format!("max_gpu_hours:{member}"), &q.max_gpu_hours)?,
                max_job_minutes: optional(
                    &format!("max_job_minutes:{member}"),
                    &q.max_job_minutes,
                )?,
            };
            Ok((member.to_string(), req))
        })
        .collect()
}

/// The lab's GPU-hours by week as CSV, for accounting: `week_start,account,gpu_hours`
/// where the account is `used`, `borrowed`, `lent` or `member:USERNAME`.
async fn usage_csv(
    state: web::Data<AppState>,
    user: CurrentUser,
    slug: web::Path<String>,
) -> Result<HttpResponse, WebError> {
    let slug = slug.into_inner();
    let name = slug.clone();
    let usage = state
        .db
        .run(move |c| labs::usage(c, &user, &slug, 26))
        .await?;
    let mut csv = String::from("week_start,account,gpu_hours\n");
    for w in usage.weeks.iter().rev() {
        for (account, v) in [("used", w.used), ("borrowed", w.borrowed), ("lent", w.lent)] {
            csv.push_str(&format!("{},{account},{v:.3}\n", w.week));
        }
    }
    for (member, hours) in &usage.members {
        for (w, h) in usage.weeks.iter().zip(hours).rev() {
            csv.push_str(&format!("{},member:{member},{h:.3}\n", w.week));
        }
    }
    Ok(HttpResponse::Ok()
        .content_type("text/csv; charset=utf-8")
        .insert_header((
            "content-disposition",
            format!("attachment; filename=\"{name}-usage.csv\""),
        ))
        .body(csv))
}
