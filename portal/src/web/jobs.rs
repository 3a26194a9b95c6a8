//! Job pages: my jobs, the submit form, one job (with a live status fragment), cancel,
//! and extending an interactive job's time limit.

use super::{number, optional, Banner};
use crate::auth::{CsrfForm, CurrentUser, NoFields};
use crate::db::models::JobEvent;
use crate::domain::JobState;
use crate::error::{AppError, WebError};
use crate::service::extend::{self as ext, ExtendRequest};
use crate::service::jobs;
use crate::service::views::JobView;
use crate::state::AppState;
use crate::validate::{JobKind, JobRequest};
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;
use serde::Deserialize;
use std::collections::BTreeMap;

/// Bytes of output shown on the job page (the API serves all of it).
const PAGE_LOG_TAIL: usize = 64 * 1024;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/jobs", web::get().to(list))
        .route("/jobs", web::post().to(create))
        .route("/jobs/new", web::get().to(new))
        .route("/jobs/{id}", web::get().to(detail))
        .route("/jobs/{id}/status", web::get().to(status))
        .route("/jobs/{id}/cancel", web::post().to(cancel))
        .route("/jobs/{id}/extend", web::post().to(extend));
}

#[derive(Template, WebTemplate)]
#[template(path = "jobs.html")]
struct JobsPage {
    banner: Banner,
    jobs: Vec<JobView>,
}

async fn list(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<JobsPage, WebError> {
    let banner = Banner::new(&state, &session, Some(&user));
    let jobs = jobs::list(&state, &user, 200).await?;
    Ok(JobsPage { banner, jobs })
}

/// The submit form's fields, as typed: kept on error so nothing the user wrote is lost.
#[derive(Debug, Clone, Deserialize)]
pub struct JobForm {
    image: String,
    #[serde(default)]
    command: String,
    #[serde(default)]
    env: String,
    gpus: String,
    #[serde(default)]
    gpu_models: String,
    #[serde(default)]
    min_gpu_memory_gb: String,
    #[serde(default)]
    cpus: String,
    #[serde(default)]
    memory_gb: String,
    time_limit_minutes: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    lab: String,
    #[serde(default)]
    checkpoint_minutes: String,
    #[serde(default)]
    shm_mb: String,
}

impl Default for JobForm {
    fn default() -> Self {
        JobForm {
            image: "commons-demo:latest".into(),
            command: "echo hello from $(hostname); sleep 5".into(),
            env: String::new(),
            gpus: "1".into(),
            gpu_models: String::new(),
            min_gpu_memory_gb: String::new(),
            cpus: "2".into(),
            memory_gb: "4".into(),
            time_limit_minutes: "60".into(),
            kind: "batch".into(),
            lab: String::new(),
            checkpoint_minutes: String::new(),
            shm_mb: String::new(),
        }
    }
}

impl JobForm {
    /// The form as an API request; the command runs through `sh -c`.
    fn to_request(&self) -> Result<JobRequest, AppError> {
        let mut env = BTreeMap::new();
        for line in self.env.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| AppError::invalid("env", format!("{line:?} is not KEY=VALUE")))?;
            env.insert(k.trim().to_string(), v.to_string());
        }
        let command = if self.command.trim().is_empty() {
            Vec::new()
        } else {
            vec!["sh".into(), "-c".into(), self.command.replace("\r\n", "\n")]
        };
        Ok(JobRequest {
            image: self.image.clone(),
            command,
            env,
            gpus: number("gpus", &self.gpus)?,
            gpu_models: self
                .gpu_models
                .split(',')
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(String::from)
                .collect(),
            min_gpu_memory_gb: optional("min_gpu_memory_gb", &self.min_gpu_memory_gb)?,
            cpus: optional("cpus", &self.cpus)?,
            memory_gb: optional("memory_gb", &self.memory_gb)?,
            time_limit_minutes: number("time_limit_minutes", &self.time_limit_minutes)?,
            kind: if self.kind == "interactive" {
                commons_api::JobKind::Interactive
            } else {
                commons_api::JobKind::Batch
            },
            lab: (!self.lab.is_empty()).then(|| self.lab.clone()),
            checkpoint_minutes: optional("checkpoint_minutes", &self.checkpoint_minutes)?,
            shm_mb: optional("shm_mb", &self.shm_mb)?,
        })
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "job_new.html")]
struct NewJobPage {
    banner: Banner,
    form: JobForm,
    labs: Vec<String>,
    /// The allow-list entries the user's labs may run (the image field's choices).
    images: Vec<crate::service::images::ImageView>,
    error: Option<String>,
    error_field: String,
}

async fn new(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<NewJobPage, WebError> {
    Ok(NewJobPage {
        banner: Banner::new(&state, &session, Some(&user)),
        labs: user.labs.iter().map(|(l, _)| l.slug.clone()).collect(),
        images: crate::service::images::for_form(&state, &user).await?,
        form: JobForm::default(),
        error: None,
        error_field: String::new(),
    })
}

async fn create(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    form: CsrfForm<JobForm>,
) -> Result<HttpResponse, WebError> {
    let form = form.0;
    let outcome = match form.to_request() {
        Ok(req) => jobs::submit(&state, &user, req).await,
        Err(e) => Err(e),
    };
    match outcome {
        Ok(view) => Ok(HttpResponse::SeeOther()
            .insert_header(("location", format!("/jobs/{}", view.id)))
            .finish()),
        Err(e @ AppError::Invalid { .. }) => {
            let page = NewJobPage {
                banner: Banner::new(&state, &session, Some(&user)),
                labs: user.labs.iter().map(|(l, _)| l.slug.clone()).collect(),
                images: crate::service::images::for_form(&state, &user).await?,
                error_field: e.field().unwrap_or_default().to_string(),
                error: Some(e.to_string()),
                form,
            };
            let body = page.render().map_err(|e| AppError::Internal(e.into()))?;
            Ok(HttpResponse::UnprocessableEntity()
                .content_type("text/html; charset=utf-8")
                .body(body))
        }
        Err(e) => Err(e.into()),
    }
}

/// What the live part of the job page shows.
struct StatusData {
    job: JobView,
    events: Vec<JobEvent>,
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
}

/// The extend form as shown: the minutes typed, and why they were refused.
struct ExtendBox {
    minutes: String,
    error: Option<String>,
}

impl ExtendBox {
    fn offered(user: &CurrentUser, job: &JobView) -> Option<Self> {
        let open = matches!(job.state, JobState::Queued | JobState::Running);
        (job.kind == JobKind::Interactive && job.user_id == user.user.id && open).then(|| {
            ExtendBox {
                minutes: "60".into(),
                error: None,
            }
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
    let (job, events, logs) = jobs::detail(state, &user, id, PAGE_LOG_TAIL).await?;
    let active = !job.state.is_final();
    Ok(StatusData {
        job,
        events,
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
    let offer = |job: &JobView| ExtendBox::offered(&user, job);
    let status = load_status(&state, &session, user.clone(), id.into_inner()).await?;
    let extend = offer(&status.job);
    let ssh = ssh_block(&state, status.job.id).await?;
    Ok(JobPage {
        banner,
        status,
        extend,
        ssh,
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
    };
    let body = page.render().map_err(|e| AppError::Internal(e.into()))?;
    Ok(HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .body(body))
}
