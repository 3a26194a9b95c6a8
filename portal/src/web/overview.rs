//! The campus overview, the home page after login: GPU counts, the queue by lab, and
//! the server map (one cell per GPU, coloured by state, details on hover and focus).

use super::charts::UseBar;
use super::{human, Banner};
use crate::auth::CurrentUser;
use crate::error::WebError;
use crate::service::overview::{self, CellState, LabLine, Overview};
use crate::state::AppState;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(index));
}

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage {
    banner: Banner,
    ov: Overview,
    /// Each lab line with its oldest wait in words.
    labs: Vec<(LabLine, String)>,
    typical_wait: String,
    legend: Vec<CellState>,
    /// The viewer's use in each lab: (lab, GPUs bar, GPU-hours bar).
    mine: Vec<(String, UseBar, UseBar)>,
    /// The viewer's web apps that are up, each with its Open button.
    apps: Vec<crate::service::apps::OpenApp>,
}

/// The overview for a signed-in user; the login page for anyone else.
async fn index(
    state: web::Data<AppState>,
    session: Session,
    user: Option<CurrentUser>,
) -> Result<HttpResponse, WebError> {
    let Some(user) = user else {
        return Ok(HttpResponse::SeeOther()
            .insert_header(("location", "/login"))
            .finish());
    };
    let banner = Banner::new(&state, &session, Some(&user));
    let offset = state.config.policy.utc_offset_s;
    let me = user.user.id;
    let (ov, apps) = state
        .db
        .run(move |c| {
            Ok::<_, crate::error::AppError>((
                overview::overview(c, &user, offset)?,
                crate::service::apps::open_apps_of(c, me)?,
            ))
        })
        .await?;
    let labs = ov
        .labs
        .iter()
        .map(|l| {
            let wait = l.oldest_wait_s.map(human::duration).unwrap_or_default();
            (l.clone(), wait)
        })
        .collect();
    let mine = ov
        .my_use
        .iter()
        .map(|u| {
            (
                u.lab.clone(),
                UseBar::gpus(
                    format!("{} in use", u.gpus_now),
                    u.gpus_now as f64,
                    u.max_gpus.map(f64::from),
                ),
                UseBar::hours(
                    format!("{} used in 7 days", human::hours(u.gpu_hours)),
                    u.gpu_hours,
                    u.max_gpu_hours,
                ),
            )
        })
        .collect();
    let page = OverviewPage {
        mine,
        apps,
        banner,
        typical_wait: ov
            .typical_wait_s
            .map(human::duration)
            .unwrap_or_else(|| "no job started in the last 7 days".into()),
        labs,
        ov,
        legend: vec![
            CellState::Owner,
            CellState::Guest,
            CellState::Lendable,
            CellState::Withheld,
            CellState::Offline,
        ],
    };
    super::html(&page)
}
