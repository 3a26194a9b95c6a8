//! The HTML UI: askama pages, each handler beside the view it renders.

mod jobs;
mod login;
mod nodes;

use crate::auth::{csrf_token, CurrentUser};
use crate::state::AppState;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(index))
        .configure(login::configure)
        .configure(jobs::configure)
        .configure(nodes::configure);
}

/// What the base layout shows on every page.
#[derive(Debug, Clone, Default)]
pub struct Banner {
    /// The insecure development login is on: every page says so.
    pub dev: bool,
    pub user: Option<String>,
    pub csrf: String,
}

impl Banner {
    pub fn new(state: &AppState, session: &Session, user: Option<&CurrentUser>) -> Self {
        Banner {
            dev: state.config.insecure_dev_login,
            user: user.map(|u| u.user.username.clone()),
            csrf: csrf_token(session),
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

async fn index(user: Option<CurrentUser>) -> HttpResponse {
    let to = if user.is_some() { "/jobs" } else { "/login" };
    HttpResponse::SeeOther()
        .insert_header(("location", to))
        .finish()
}
