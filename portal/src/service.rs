//! Use cases shared by the API and the web UI, so both behave the same.

use crate::api::views::{job_view, JobView};
use crate::auth::CurrentUser;
use crate::db::jobs;
use crate::error::AppError;
use crate::state::AppState;
use crate::validate::{self, JobRequest};
use commons_proto::PortalMsg;

/// Validates and stores a job, then wakes the scheduler. Nothing is written when any
/// rule fails.
pub async fn submit(
    state: &AppState,
    user: CurrentUser,
    req: JobRequest,
) -> Result<JobView, AppError> {
    let valid = validate::job(req, &user.lab_ids())?;
    let view = state
        .db
        .run(move |c| {
            let job = jobs::insert(c, user.user.id, &valid)?;
            job_view(c, &job)
        })
        .await?;
    tracing::info!(job = view.id, "job submitted");
    state.wake.notify_one();
    Ok(view)
}

/// Cancels a job the user may see, and tells its node to stop the container.
pub async fn cancel(state: &AppState, user: CurrentUser, id: i64) -> Result<JobView, AppError> {
    let who = user.user.username.clone();
    let (view, attempt) = state
        .db
        .run(move |c| {
            let job = jobs::get_for(c, id, &user)?;
            let attempt = jobs::cancel(c, &job, &who)?;
            let job = jobs::get(c, id)?;
            Ok::<_, AppError>((job_view(c, &job)?, attempt))
        })
        .await?;
    if let Some(a) = attempt {
        state.agents.send(
            a.node_id,
            PortalMsg::Stop {
                job: a.job_id,
                attempt: a.attempt,
                grace_s: 10,
                reason: "cancelled".into(),
            },
        );
    }
    Ok(view)
}
