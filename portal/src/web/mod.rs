//! The HTML UI: askama pages, each handler beside the view it renders.

mod app_presets;
mod apps;
pub mod assets;
mod charts;
mod cli_login;
mod datasets;
mod files;
pub mod human;
mod images;
mod job_chart;
mod job_form;
mod job_list;
mod jobs;
mod labs;
mod launch;
mod login;
mod nodes;
mod overview;
mod settings;
mod ssh_keys;
mod tokens;
mod usage;

use crate::auth::{csrf_token, CurrentUser};
use crate::error::{AppError, ErrorPageInfo};
use crate::state::AppState;
use actix_session::{Session, SessionExt};
use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{web, FromRequest, HttpResponse};
use askama::Template;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.configure(overview::configure)
        .configure(apps::configure)
        .configure(app_presets::configure)
        .configure(assets::configure)
        .configure(login::configure)
        .configure(cli_login::configure)
        .configure(files::configure)
        .configure(images::configure)
        .configure(job_chart::configure)
        .configure(job_list::configure)
        .configure(jobs::configure)
        .configure(labs::configure)
        .configure(launch::configure)
        .configure(nodes::configure)
        .configure(settings::configure)
        .configure(ssh_keys::configure)
        .configure(datasets::configure)
        .configure(tokens::configure)
        .configure(usage::configure);
}

/// What the base layout shows on every page.
#[derive(Debug, Clone, Default)]
pub struct Banner {
    /// The insecure development login is on: every page says so.
    pub dev: bool,
    pub user: Option<String>,
    pub csrf: String,
    /// Slugs of the labs the user administers (for the navigation).
    pub admin_labs: Vec<String>,
    pub operator: bool,
}

impl Banner {
    pub fn new(state: &AppState, session: &Session, user: Option<&CurrentUser>) -> Self {
        Banner {
            dev: state.config.insecure_dev_login,
            user: user.map(|u| u.user.username.clone()),
            csrf: csrf_token(session),
            admin_labs: user
                .map(|u| {
                    u.labs
                        .iter()
                        .filter(|(l, _)| u.admin_of(l.id))
                        .map(|(l, _)| l.slug.clone())
                        .collect()
                })
                .unwrap_or_default(),
            operator: user.is_some_and(|u| u.user.is_operator),
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
pub struct ErrorPage {
    pub banner: Banner,
    pub status: u16,
    pub message: String,
}

/// Renders HTML error pages again with the header of the signed-in user, so an error
/// never strands anyone without navigation. (The error itself is made where the request
/// failed, which knows nothing of the session.)
pub async fn error_pages(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let res = next.call(req).await?.map_into_boxed_body();
    let Some(info) = res.response().extensions().get::<ErrorPageInfo>().cloned() else {
        return Ok(res);
    };
    let http = res.request().clone();
    let Some(state) = http.app_data::<web::Data<AppState>>().cloned() else {
        return Ok(res);
    };
    let user = CurrentUser::extract(&http).await.ok();
    let page = ErrorPage {
        banner: Banner::new(&state, &http.get_session(), user.as_ref()),
        status: info.status,
        message: info.message,
    };
    let Ok(body) = page.render() else {
        return Ok(res);
    };
    let mut res = res.map_body(|_, _| BoxBody::new(body));
    res.headers_mut().insert(
        actix_web::http::header::CONTENT_TYPE,
        actix_web::http::header::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    Ok(res)
}

/// A page answered with `status` (a refused form, a page of its own state). Like every
/// answer it is never cached (`cache-control: no-store` from the security headers in
/// `app.rs`): it may carry what the user typed.
pub(crate) fn html_page(
    status: actix_web::http::StatusCode,
    page: &impl Template,
) -> Result<HttpResponse, crate::error::WebError> {
    let body = page.render().map_err(|e| AppError::Internal(e.into()))?;
    Ok(HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .body(body))
}

/// A form field as a number, or an error naming the field.
pub(crate) fn number<T: std::str::FromStr>(field: &str, text: &str) -> Result<T, AppError> {
    text.trim()
        .parse()
        .map_err(|_| AppError::invalid(field, format!("{:?} is not a number", text.trim())))
}

/// An optional form field (empty means none).
pub(crate) fn optional<T: std::str::FromStr>(
    field: &str,
    text: &str,
) -> Result<Option<T>, AppError> {
    if text.trim().is_empty() {
        Ok(None)
    } else {
        number(field, text).map(Some)
    }
}

/// A page as a 200 HTML response.
pub(crate) fn html(page: &impl Template) -> Result<HttpResponse, crate::error::WebError> {
    let body = page.render().map_err(|e| AppError::Internal(e.into()))?;
    Ok(HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(body))
}
