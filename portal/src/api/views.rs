//! What the API (and the live job page) show of a job: one read model for both.

use crate::db::models::{Attempt, Job};
use crate::db::{jobs, nodes, DbConn};
use crate::error::AppError;
use chrono::NaiveDateTime;
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct GpuView {
    pub uuid: String,
    pub index: i32,
    pub model: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    pub id: i64,
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Vec<GpuView>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    pub attempts: i32,
    pub image: String,
    pub command: Vec<String>,
    pub gpus_requested: i32,
    pub gpu_models: Vec<String>,
    pub time_limit_minutes: i64,
    pub kind: String,
    pub lab: String,
    pub created_at: NaiveDateTime,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<NaiveDateTime>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<NaiveDateTime>,
}

pub fn job_view(c: &mut DbConn, job: &Job) -> Result<JobView, AppError> {
    let last: Option<Attempt> = jobs::attempts(c, job.id)?.pop();
    let node = match job.node_id.or(last.as_ref().map(|a| a.node_id)) {
        Some(id) => Some(nodes::node_by_id(c, id)?.name),
        None => None,
    };
    let gpus = match &last {
        Some(a) => Some(
            nodes::gpus_by_ids(c, &a.gpu_id_list())?
                .into_iter()
                .map(|g| GpuView {
                    uuid: g.uuid,
                    index: g.idx,
                    model: g.model,
                })
                .collect(),
        ),
        None => None,
    };
    let lab: String = {
        use diesel::prelude::*;
        crate::db::schema::labs::table
            .find(job.lab_id)
            .select(crate::db::schema::labs::slug)
            .first(c)?
    };
    Ok(JobView {
        id: job.id,
        state: job.state.clone(),
        reason: job.reason.clone(),
        queue_position: job.queue_position,
        node,
        gpus,
        exit_code: job.exit_code,
        attempts: job.attempts,
        image: job.image.clone(),
        command: job.command_vec(),
        gpus_requested: job.gpus,
        gpu_models: job.models_vec(),
        time_limit_minutes: job.time_limit_s / 60,
        kind: job.kind.clone(),
        lab,
        created_at: job.created_at,
        started_at: job.started_at,
        finished_at: job.finished_at,
    })
}
