//! The submit form: the page, the submission (kept as typed on a refusal), and job
//! templates saved from it.

use super::{number, optional, Banner};
use crate::auth::{CsrfForm, CurrentUser, NoFields};
use crate::error::{AppError, WebError};
use crate::service::{job_templates, jobs};
use crate::state::AppState;
use crate::validate::JobRequest;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;
use askama_web::WebTemplate;
use serde::Deserialize;
use std::collections::BTreeMap;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/jobs", web::post().to(create))
        .route("/jobs/new", web::get().to(new))
        .route(
            "/jobs/templates/{id}/delete",
            web::post().to(delete_template),
        );
}

/// The submit form's fields, as typed: kept on error so nothing the user wrote is lost.
/// Saved as JSON in job templates (without the template's own fields).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
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
    gpu_fraction: String,
    #[serde(default)]
    gpu_memory_gb: String,
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
    #[serde(default)]
    disk_gb: String,
    #[serde(default)]
    name: String,
    /// `key=value` tags, separated by spaces.
    #[serde(default)]
    tags: String,
    /// Jobs to wait for: `41 42:fail 43:any` (a bare id waits for success).
    #[serde(default)]
    after: String,
    /// Inputs staged under /inputs, one per line (`data/train.tar`, `lab:vision/code/`).
    #[serde(default)]
    inputs: String,
    /// Datasets, one per line (`vision/imagenet`, `vision/coco:/data/coco`).
    #[serde(default)]
    datasets: String,
    /// "Save as template": the name, and the button (present when pressed).
    #[serde(default, skip_serializing)]
    template_name: String,
    #[serde(default, skip_serializing)]
    save_template: Option<String>,
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
            gpu_fraction: String::new(),
            gpu_memory_gb: String::new(),
            cpus: "2".into(),
            memory_gb: "4".into(),
            time_limit_minutes: "60".into(),
            kind: "batch".into(),
            lab: String::new(),
            checkpoint_minutes: String::new(),
            shm_mb: String::new(),
            disk_gb: String::new(),
            name: String::new(),
            tags: String::new(),
            after: String::new(),
            inputs: String::new(),
            datasets: String::new(),
            template_name: String::new(),
            save_template: None,
        }
    }
}

/// A number for a form field: no decimals when it has none.
fn field_number(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        x.to_string()
    }
}

impl JobForm {
    /// The form filled from a stored job ("submit again"). A command the form wrapped in
    /// `sh -c` comes back as typed; any other is joined, quoting words with spaces.
    fn from_job(job: &crate::db::models::Job, lab: String) -> JobForm {
        let cmd = &job.command.0;
        let command = match cmd.as_slice() {
            [sh, c, script] if sh == "sh" && c == "-c" => script.clone(),
            words => words
                .iter()
                .map(|w| {
                    if w.contains(char::is_whitespace) || w.is_empty() {
                        format!("'{}'", w.replace('\'', "'\\''"))
                    } else {
                        w.clone()
                    }
                })
                .collect::<Vec<_>>()
                .join(" "),
        };
        let gb = |mb: i64| field_number(mb as f64 / 1024.0);
        JobForm {
            image: job.image.clone(),
            command,
            env: job
                .env
                .0
                .iter()
                // An array task's COMMONS_ARRAY_* are the portal's, not the user's.
                .filter(|(k, _)| !k.starts_with("COMMONS_"))
                .map(|(k, v)| format!("{k}={v}\n"))
                .collect(),
            gpus: job.gpus.to_string(),
            gpu_models: job.gpu_models.0.join(", "),
            min_gpu_memory_gb: if job.min_gpu_memory_mb > 0 {
                gb(job.min_gpu_memory_mb)
            } else {
                String::new()
            },
            gpu_fraction: job
                .gpu_milli
                .filter(|m| *m > 0)
                .map(|m| field_number(f64::from(m) / 1000.0))
                .unwrap_or_default(),
            gpu_memory_gb: job
                .gpu_share_memory_mb
                .filter(|m| *m > 0)
                .map(gb)
                .unwrap_or_default(),
            cpus: field_number(job.cpus),
            memory_gb: gb(job.memory_mb),
            time_limit_minutes: (job.time_limit_s / 60).to_string(),
            kind: job.kind.as_str().to_string(),
            lab,
            checkpoint_minutes: job
                .checkpoint_interval_s
                .map(|s| (s / 60).to_string())
                .unwrap_or_default(),
            shm_mb: job.shm_mb.map(|m| m.to_string()).unwrap_or_default(),
            disk_gb: job.disk_gb.map(|g| g.to_string()).unwrap_or_default(),
            name: job.name.clone().unwrap_or_default(),
            tags: job
                .tags
                .0
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
            after: job
                .after_jobs
                .0
                .iter()
                .map(|a| match a.when {
                    commons_api::flows::When::Ok => a.job.to_string(),
                    w => format!("{}:{}", a.job, w.as_str()),
                })
                .collect::<Vec<_>>()
                .join(" "),
            inputs: job.inputs.0.join("\n"),
            datasets: job
                .datasets
                .0
                .iter()
                .map(commons_api::datasets::written)
                .collect::<Vec<_>>()
                .join("\n"),
            template_name: String::new(),
            save_template: None,
        }
    }

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
            array: None,
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
            gpu_fraction: optional("gpu_fraction", &self.gpu_fraction)?,
            gpu_memory_gb: optional("gpu_memory_gb", &self.gpu_memory_gb)?,
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
            disk_gb: optional("disk_gb", &self.disk_gb)?,
            notify: None,
            name: Some(self.name.trim().to_string()).filter(|n| !n.is_empty()),
            tags: self
                .tags
                .split_whitespace()
                .map(|t| commons_api::flows::parse_tag("tags", t))
                .collect::<Result<_, _>>()?,
            after: self
                .after
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|t| !t.is_empty())
                .map(commons_api::flows::parse_after)
                .collect::<Result<_, _>>()?,
            // The launch page starts apps; this form does not ask for one.
            app: None,
            inputs: self
                .inputs
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect(),
            datasets: self
                .datasets
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(commons_api::datasets::parse_written)
                .collect::<Result<_, _>>()?,
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
    /// The user's saved templates: (id, name).
    templates: Vec<(i64, String)>,
}

#[derive(Debug, Deserialize)]
pub struct NewQuery {
    /// "Submit again": the job whose settings fill the form.
    from: Option<i64>,
    /// A saved template that fills the form.
    template: Option<i64>,
}

async fn new(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    query: web::Query<NewQuery>,
) -> Result<NewJobPage, WebError> {
    let form = match (query.from, query.template) {
        (_, Some(t)) => {
            let saved = job_templates::get(&state, &user, t).await?;
            let mut form: JobForm = serde_json::from_str(&saved.form)
                .map_err(|e| AppError::Internal(anyhow::anyhow!("template {t}: {e}")))?;
            form.template_name = saved.name;
            form
        }
        (Some(id), None) => {
            let job = jobs::stored(&state, &user, id).await?;
            let lab = user
                .labs
                .iter()
                .find(|(l, _)| l.id == job.lab_id)
                .map(|(l, _)| l.slug.clone())
                .unwrap_or_default();
            JobForm::from_job(&job, lab)
        }
        (None, None) => JobForm::default(),
    };
    Ok(NewJobPage {
        banner: Banner::new(&state, &session, Some(&user)),
        labs: user.labs.iter().map(|(l, _)| l.slug.clone()).collect(),
        images: crate::service::images::for_form(&state, &user).await?,
        templates: template_names(&state, &user).await?,
        form,
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
    if form.save_template.is_some() {
        let json = serde_json::to_string(&form).map_err(|e| AppError::Internal(e.into()))?;
        match job_templates::save(&state, &user, &form.template_name, json).await {
            Ok(id) => {
                return Ok(HttpResponse::SeeOther()
                    .insert_header(("location", format!("/jobs/new?template={id}")))
                    .finish())
            }
            Err(e @ AppError::Invalid { .. }) => {
                return refused_form(&state, &session, &user, form, e).await
            }
            Err(e) => return Err(e.into()),
        }
    }
    let outcome = match form.to_request() {
        Ok(req) => jobs::submit(&state, &user, req).await,
        Err(e) => Err(e),
    };
    match outcome {
        Ok(view) => Ok(HttpResponse::SeeOther()
            .insert_header(("location", format!("/jobs/{}", view.id)))
            .finish()),
        Err(e @ AppError::Invalid { .. }) => refused_form(&state, &session, &user, form, e).await,
        Err(e) => Err(e.into()),
    }
}

/// The form again with what was typed and the refusal beside its field (422).
async fn refused_form(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    form: JobForm,
    e: AppError,
) -> Result<HttpResponse, WebError> {
    let page = NewJobPage {
        banner: Banner::new(state, session, Some(user)),
        labs: user.labs.iter().map(|(l, _)| l.slug.clone()).collect(),
        images: crate::service::images::for_form(state, user).await?,
        templates: template_names(state, user).await?,
        error_field: e.field().unwrap_or_default().to_string(),
        error: Some(e.to_string()),
        form,
    };
    let body = page.render().map_err(|e| AppError::Internal(e.into()))?;
    Ok(HttpResponse::UnprocessableEntity()
        .content_type("text/html; charset=utf-8")
        .body(body))
}

async fn template_names(
    state: &AppState,
    user: &CurrentUser,
) -> Result<Vec<(i64, String)>, WebError> {
    Ok(job_templates::list(state, user)
        .await?
        .into_iter()
        .map(|t| (t.id, t.name))
        .collect())
}

/// Deletes one of the user's templates.
async fn delete_template(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    _form: CsrfForm<NoFields>,
) -> Result<HttpResponse, WebError> {
    job_templates::delete(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", "/jobs/new"))
        .finish())
}
