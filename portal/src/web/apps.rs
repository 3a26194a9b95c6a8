//! `/apps/open`: the portal's half of opening a job's web app. The app's origin sends a
//! visitor without its cookie here; for the job's owner (signed in), the portal answers
//! with a redirect to the app's origin carrying a one-time code.

use crate::auth::CurrentUser;
use crate::error::WebError;
use crate::service::apps;
use crate::state::AppState;
use actix_web::{http::header, web, HttpResponse};
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/apps/open", web::get().to(open));
}

#[derive(Deserialize)]
struct OpenQuery {
    /// The app origin's label.
    host: String,
    /// The path on the app's origin to go on to.
    #[serde(default)]
    next: String,
}

async fn open(
    state: web::Data<AppState>,
    user: CurrentUser,
    q: web::Query<OpenQuery>,
) -> Result<HttpResponse, WebError> {
    let q = q.into_inner();
    let to = apps::open(&state, &user, q.host, q.next).await?;
    Ok(HttpResponse::Found()
        .insert_header((header::LOCATION, to))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .finish())
}
