//! `/api/v1/jobs`: submit, list (the caller's, or a lab's for its admins), read, logs
//! (from an offset, for followers), history, cancel, extend.

use super::ApiJson;
use crate::auth::CurrentUser;
use crate::error::{ApiError, AppError};
use crate::service::extend::ExtendRequest;
use crate::service::job_list::{self, Scope};
use crate::service::{extend as ext, jobs};
use crate::state::AppState;
use crate::validate::JobRequest;
use actix_web::{web, HttpRequest, HttpResponse};
use commons_api::{ErrorBody, JobEvent, JobView};
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/jobs", web::post().to(submit))
        .route("/jobs", web::get().to(list))
        .route("/jobs/{id}", web::get().to(get))
        .route("/jobs/{id}/logs", web::get().to(logs))
        .route("/jobs/{id}/events", web::get().to(events))
        .route("/jobs/{id}/cancel", web::post().to(cancel))
        .route("/jobs/{id}/extend", web::post().to(extend));
}

/// Submits a job, or with `array` an array of tasks (the answer is then an `ArrayView`).
/// It is checked whole first: a refused request stores nothing.
#[utoipa::path(post, path = "/api/v1/jobs", tag = "jobs", operation_id = "submit_job",
    request_body = JobRequest,
    responses(
        (status = 201, description = "Queued: the job, or with `array` the array (an `ArrayView`)",
            body = JobView),
        (status = "4XX", description = "Refused: `field` names what to fix (422)", body = ErrorBody),
    ))]
pub(crate) async fn submit(
    state: web::Data<AppState>,
    user: CurrentUser,
    body: ApiJson<JobRequest>,
) -> Result<HttpResponse, ApiError> {
    if body.0.array.is_some() {
        let view = crate::service::arrays::submit(&state, &user, body.0).await?;
        return Ok(HttpResponse::Created().json(view));
    }
    let view = jobs::submit(&state, &user, body.0).await?;
    Ok(HttpResponse::Created().json(view))
}

#[derive(Deserialize, Default, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    /// A lab's jobs (its admins), instead of the caller's own; each then says whose it is.
    lab: Option<String>,
    /// Only jobs with this name (ignoring case); `sweep-*`: names that begin so.
    name: Option<String>,
    /// Only jobs with this tag, `key=value` (repeat: jobs with all of them).
    #[serde(default)]
    tag: Vec<String>,
    /// Only the tasks of this array (its id), in index order; the other filters are
    /// then left out.
    array: Option<String>,
}

impl ListQuery {
    /// Reads the query string (`tag` may repeat, which `web::Query` cannot read).
    fn parse(query: &str) -> Result<ListQuery, AppError> {
        let mut q = ListQuery::default();
        for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "lab" => q.lab = Some(v.into_owned()),
                "name" => q.name = Some(v.into_owned()),
                "tag" => q.tag.push(v.into_owned()),
                "array" => q.array = Some(v.into_owned()),
                other => {
                    return Err(AppError::BadRequest(format!(
                        "the query string is not valid for this request: unknown field `{other}`"
                    )))
                }
            }
        }
        Ok(q)
    }
}

/// The caller's jobs, or with `?lab=SLUG` the lab's (its admins), newest first, at most
/// 500; `?name=` and `?tag=key=value` keep those with that name and tags; `?array=ID` lists
/// an array's tasks (all of them, in index order). A lab's jobs are
/// `LabJobView`s: each also has `user`, whose it is.
#[utoipa::path(get, path = "/api/v1/jobs", tag = "jobs", operation_id = "list_jobs",
    params(ListQuery),
    responses(
        (status = 200, description = "Newest first; with `lab`, each job also has `user` (a `LabJobView`)",
            body = Vec<JobView>),
        (status = "4XX", description = "Refused (403: not the lab's admin; 422: a bad filter, named in `field`)", body = ErrorBody),
    ))]
pub(crate) async fn list(
    state: web::Data<AppState>,
    user: CurrentUser,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query = ListQuery::parse(req.query_string())?;
    if let Some(array) = crate::service::arrays::parse_filter(query.array.as_deref().unwrap_or(""))?
    {
        let views = crate::service::arrays::tasks(&state, &user, array).await?;
        return Ok(HttpResponse::Ok().json(views));
    }
    let filtered = query.name.is_some() || !query.tag.is_empty();
    match (query.lab, filtered) {
        (lab, true) => {
            let scope = lab.clone().map_or(Scope::Mine, Scope::Lab);
            let name = query.name.unwrap_or_default();
            let views = job_list::filtered(&state, &user, scope, &name, &query.tag, 500).await?;
            if lab.is_some() {
                Ok(HttpResponse::Ok().json(views))
            } else {
                let mine: Vec<JobView> = views.into_iter().map(|v| v.job).collect();
                Ok(HttpResponse::Ok().json(mine))
            }
        }
        (Some(slug), false) => {
            let views = jobs::list_lab(&state, &user, slug, 500).await?;
            Ok(HttpResponse::Ok().json(views))
        }
        (None, false) => {
            let views = jobs::list(&state, &user, 500).await?;
            Ok(HttpResponse::Ok().json(views))
        }
    }
}

/// One job (the caller's, or one they administer the lab of).
#[utoipa::path(get, path = "/api/v1/jobs/{id}", tag = "jobs", operation_id = "get_job",
    params(("id" = i64, Path, description = "The job's id")),
    responses(
        (status = 200, description = "The job", body = JobView),
        (status = "4XX", description = "Refused (404 for a job the caller may not see)", body = ErrorBody),
    ))]
pub(crate) async fn get(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let view = jobs::get(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(view))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct LogsQuery {
    /// Only the output from this byte on (what a follower has not seen yet).
    #[param(minimum = 0)]
    offset: Option<usize>,
}

/// The job's output; with `?offset=N` from byte N on (the next character boundary).
/// `x-log-bytes` says how long the whole output is, so a follower knows where it is.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/logs", tag = "jobs", operation_id = "job_logs",
    params(("id" = i64, Path, description = "The job's id"), LogsQuery),
    responses(
        (status = 200, description = "The output as text", body = String,
            content_type = "text/plain",
            headers(("x-log-bytes" = u64, description = "Bytes of the whole output"))),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn logs(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    query: web::Query<LogsQuery>,
) -> Result<HttpResponse, ApiError> {
    let text = jobs::logs(&state, &user, id.into_inner()).await?;
    let total = text.len();
    let mut from = query.offset.unwrap_or(0).min(total);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .insert_header(("x-log-bytes", total.to_string()))
        .body(text[from..].to_string()))
}

/// The job's state history, oldest first.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/events", tag = "jobs", operation_id = "job_events",
    params(("id" = i64, Path, description = "The job's id")),
    responses(
        (status = 200, description = "Oldest first", body = Vec<JobEvent>),
        (status = "4XX", description = "Refused", body = ErrorBody),
    ))]
pub(crate) async fn events(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let events = jobs::events(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(events))
}

/// Cancels the job; a running one is stopped on its server.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/cancel", tag = "jobs", operation_id = "cancel_job",
    params(("id" = i64, Path, description = "The job's id")),
    responses(
        (status = 200, description = "The job, cancelled", body = JobView),
        (status = "4XX", description = "Refused (409: it has ended)", body = ErrorBody),
    ))]
pub(crate) async fn cancel(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let view = jobs::cancel(&state, &user, id.into_inner()).await?;
    Ok(HttpResponse::Ok().json(view))
}

/// `{minutes}` more for the caller's queued or running interactive job.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/extend", tag = "jobs", operation_id = "extend_job",
    params(("id" = i64, Path, description = "The job's id")),
    request_body = ExtendRequest,
    responses(
        (status = 200, description = "The job with its new time limit", body = JobView),
        (status = "4XX", description = "Refused: a batch job, an ended one, or past a limit", body = ErrorBody),
    ))]
pub(crate) async fn extend(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    body: ApiJson<ExtendRequest>,
) -> Result<HttpResponse, ApiError> {
    let view = ext::extend(&state, &user, id.into_inner(), body.0).await?;
    Ok(HttpResponse::Ok().json(view))
}
