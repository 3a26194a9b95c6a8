//! Job pages: my jobs, the submit form, one job (with a live status fragment), cancel,
//! and extending an interactive job's time limit.

use super::human::{self, When};
use super::{number, Banner};
use crate::auth::{CsrfForm, CurrentUser, NoFields};
use crate::db::models::JobEvent;
use crate::error::{AppError, WebError};
use crate::service::extend::{self as ext, ExtendRequest};
use crate::service::jobs;
use crate::service::views::JobView;
use crate::state::AppState;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;
use commons_api::JobState as ApiState;
use serde::Deserialize;

/// Bytes of output shown on the job page (the API serves all of it).
const PAGE_LOG_TAIL: usize = 64 * 1024;

pub fn configure(cfg: &mut web::ServiceConfig) {
    // The form's routes first: `/jobs/new` before `/jobs/{id}`.
    super::job_form::configure(cfg);
    cfg.route("/jobs/{id}", web::get().to(detail))
        .route("/jobs/{id}/status", web::get().to(status))
        .route("/jobs/{id}/log.txt", web::get().to(log_download))
        .route("/jobs/{id}/cancel", web::post().to(cancel))
        .route("/jobs/{id}/extend", web::post().to(extend));
}

/// What the live part of the job page shows.
struct StatusData {
    job: JobView,
    /// The owner's user id.
    owner: i64,
    /// The history, each entry with its time as people read it.
    events: Vec<(JobEvent, When)>,
    /// Submitted, started, finished: the ones the job has.
    times: Vec<(&'static str, When)>,
    /// While waiting: when it should start, or "unknown".
    estimated: Option<String>,
    logs: String,
    active: bool,
    csrf: String,
}

/// The part of the job page that updates live (the full page includes it).
#[derive(Template, WebTemplate)]
#[template(path = "job_status.html")]
struct JobStatus {
    status: StatusData,
}

#[derive(Template, WebTemplate)]
#[template(path = "job.html")]
struct JobPage {
    banner: Banner,
    status: StatusData,
    /// How to connect over SSH, when the gateway is on.
    ssh: Option<SshBlock>,
    /// The "Extend" form, for the owner of a queued or running interactive job. Outside
    /// the live fragment, so a refresh keeps what was typed and the error beside it.
    extend: Option<ExtendBox>,
    /// The GPU utilisation chart (refreshed by the page's script on its own).
    utilization: super::job_chart::UtilizationBlock,
    /// What the job kept of `/outputs` (its owner only).
    outputs: Option<super::files::OutputsBlock>,
}

/// The extend form as shown: the minutes typed, and why they were refused.
struct ExtendBox {
    minutes: String,
    error: Option<String>,
}

impl ExtendBox {
    fn offered(user: &CurrentUser, job: &JobView, owner: i64) -> Option<Self> {
        let open = matches!(job.state, ApiState::Queued | ApiState::Running);
        let interactive = job.kind == commons_api::JobKind::Interactive;
        (interactive && owner == user.user.id && open).then(|| ExtendBox {
            minutes: "60".into(),
            error: None,
        })
    }
}

/// The job page's SSH section.
struct SshBlock {
    command: String,
    config: String,
    known_hosts: String,
    fingerprint: String,
}

/// How to connect to job `job` over SSH, when the gateway is on.
async fn ssh_block(state: &AppState, job: i64) -> Result<Option<SshBlock>, WebError> {
    let endpoint = state
        .config
        .ssh
        .public_endpoint(state.config.public_url.as_deref());
    Ok(crate::service::ssh::gateway(state, endpoint)
        .await?
        .map(|g| SshBlock {
            command: g.command(job),
            config: g.config_block(job),
            known_hosts: g.known_hosts.clone(),
            fingerprint: g.fingerprint.clone(),
        }))
}

async fn load_status(
    state: &AppState,
    session: &Session,
    user: CurrentUser,
    id: i64,
) -> Result<StatusData, WebError> {
    let csrf = crate::auth::csrf_token(session);
    let jobs::Detail {
        job,
        owner,
        events,
        logs,
    } = jobs::detail(state, &user, id, PAGE_LOG_TAIL).await?;
    let active = !job.state.is_final();
    let now = crate::db::now();
    let offset = state.config.policy.utc_offset_s;
    let when = |t| When::new(t, now, offset);
    let times = [
        ("Submitted", Some(job.created_at)),
        ("Started", job.started_at),
        ("Finished", job.finished_at),
    ]
    .into_iter()
    .filter_map(|(label, t)| t.map(|t| (label, when(t))))
    .collect();
    Ok(StatusData {
        estimated: job.estimated_start_at.map(|e| match e {
            Some(t) => format!("{} ({})", human::ago(t, now), human::at(t, offset)),
            None => "unknown".to_string(),
        }),
        times,
        events: events
            .into_iter()
            .map(|e| {
                let w = when(e.at);
                (e, w)
            })
            .collect(),
        job,
        owner,
        logs,
        active,
        csrf,
    })
}

async fn detail(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<JobPage, WebError> {
    let banner = Banner::new(&state, &session, Some(&user));
    let status = load_status(&state, &session, user.clone(), id.into_inner()).await?;
    let extend = ExtendBox::offered(&user, &status.job, status.owner);
    let ssh = ssh_block(&state, status.job.id).await?;
    let utilization = super::job_chart::block(&state, &user, status.job.id).await?;
    let outputs = super::files::outputs_block(&state, &user, status.job.id, status.owner).await?;
    Ok(JobPage {
        banner,
        status,
        extend,
        ssh,
        utilization,
        outputs,
    })
}

async fn status(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<JobStatus, WebError> {
    let status = load_status(&state, &session, user, id.into_inner()).await?;
    Ok(JobStatus { status })
}

/// All of the job's output as a file.
async fn log_download(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, WebError> {
    let id = id.into_inner();
    let text = jobs::logs(&state, &user, id).await?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .insert_header((
            "content-disposition",
            format!("attachment; filename=\"job-{id}.log\""),
        ))
        .body(text))
}

async fn cancel(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    _form: CsrfForm<NoFields>,
) -> Result<HttpResponse, WebError> {
    let id = id.into_inner();
    jobs::cancel(&state, &user, id).await?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", format!("/jobs/{id}")))
        .finish())
}

#[derive(Debug, Clone, Deserialize)]
pub struct ExtendForm {
    minutes: String,
}

/// Extends the job's time limit, or shows the job page again with the reason next to
/// the field (422).
async fn extend(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    id: web::Path<i64>,
    form: CsrfForm<ExtendForm>,
) -> Result<HttpResponse, WebError> {
    let id = id.into_inner();
    let minutes = form.0.minutes;
    let outcome = match number("minutes", &minutes) {
        Ok(m) => ext::extend(&state, &user, id, ExtendRequest { minutes: m }).await,
        Err(e) => Err(e),
    };
    let refused = match outcome {
        Ok(_) => {
            return Ok(HttpResponse::SeeOther()
                .insert_header(("location", format!("/jobs/{id}")))
                .finish())
        }
        Err(e @ (AppError::Invalid { .. } | AppError::Conflict { .. })) => e,
        Err(e) => return Err(e.into()),
    };
    let status = refused.status();
    let page = JobPage {
        banner: Banner::new(&state, &session, Some(&user)),
        status: load_status(&state, &session, user.clone(), id).await?,
        extend: Some(ExtendBox {
            minutes,
            error: Some(refused.to_string()),
        }),
        ssh: ssh_block(&state, id).await?,
        utilization: super::job_chart::block(&state, &user, id).await?,
        outputs: None,
    };
    let body = page.render().map_err(|e| AppError::Internal(e.into()))?;
    Ok(HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .body(body))
}
