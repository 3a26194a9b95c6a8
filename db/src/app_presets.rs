//! App presets: the queries. The rules (who may write which, the image check) are in
//! `service::app_presets`; the shape of a preset in `commons_api::app_preset`.
//!
//! Invariant: one preset per (lab or campus, `name`): a UNIQUE index on
//! `(COALESCE(lab_id, 0), name)`; a second one of the same name is reported as `None`,
//! never as an internal error.

use super::schema::app_presets;
use super::types::{to_json, Json};
use super::DbError;
use super::{now, DbConn};
use commons_api::app_preset::{Choice, PresetSpec};
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};

/// A stored preset.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = app_presets)]
pub struct PresetRow {
    pub id: i64,
    /// `None`: the whole campus's.
    pub lab_id: Option<i64>,
    pub name: String,
    pub title: String,
    pub description: String,
    pub colour: String,
    pub image: String,
    pub command: Json<Vec<String>>,
    pub port: i32,
    pub gpus: i32,
    pub max_gpus: i32,
    pub hours: i32,
    pub max_hours: i32,
    pub cpus: f64,
    pub max_cpus: f64,
    pub memory_gb: f64,
    pub max_memory_gb: f64,
    /// Comma-separated [`Choice`]s.
    pub user_sets: String,
    pub idle_minutes: i32,
    pub updated_by: String,
    pub updated_at: chrono::NaiveDateTime,
}

impl PresetRow {
    /// The preset as the API describes it.
    pub fn spec(&self) -> PresetSpec {
        PresetSpec {
            name: self.name.clone(),
            title: self.title.clone(),
            description: self.description.clone(),
            colour: self.colour.clone(),
            image: self.image.clone(),
            command: self.command.0.clone(),
            port: self.port.into(),
            gpus: self.gpus.into(),
            max_gpus: self.max_gpus.into(),
            hours: self.hours.into(),
            max_hours: self.max_hours.into(),
            cpus: self.cpus,
            max_cpus: self.max_cpus,
            memory_gb: self.memory_gb,
            max_memory_gb: self.max_memory_gb,
            user_sets: self
                .user_sets
                .split(',')
                .filter_map(Choice::parse)
                .collect(),
            idle_minutes: self.idle_minutes.into(),
        }
    }
}

fn int(field: &str, v: i64) -> Result<i32, DbError> {
    i32::try_from(v).map_err(|_| DbError::Invalid {
        field: field.to_string(),
        message: format!("{v} is out of range"),
    })
}

/// The columns of `spec` as one tuple of assignments (for inserts and updates).
macro_rules! columns {
    ($spec:expr, $command:expr, $sets:expr, $by:expr) => {
        (
            app_presets::name.eq(&$spec.name),
            app_presets::title.eq(&$spec.title),
            app_presets::description.eq(&$spec.description),
            app_presets::colour.eq(&$spec.colour),
            app_presets::image.eq(&$spec.image),
            app_presets::command.eq($command),
            app_presets::port.eq(int("port", $spec.port)?),
            app_presets::gpus.eq(int("gpus", $spec.gpus)?),
            app_presets::max_gpus.eq(int("max_gpus", $spec.max_gpus)?),
            app_presets::hours.eq(int("hours", $spec.hours)?),
            app_presets::max_hours.eq(int("max_hours", $spec.max_hours)?),
            app_presets::cpus.eq($spec.cpus),
            app_presets::max_cpus.eq($spec.max_cpus),
            app_presets::memory_gb.eq($spec.memory_gb),
            app_presets::max_memory_gb.eq($spec.max_memory_gb),
            app_presets::user_sets.eq($sets),
            app_presets::idle_minutes.eq(int("idle_minutes", $spec.idle_minutes)?),
            app_presets::updated_by.eq($by),
            app_presets::updated_at.eq(now()),
        )
    };
}

fn sets(spec: &PresetSpec) -> String {
    spec.user_sets
        .iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// Stores a preset for `lab` (`None`: the campus); its id, or `None` when that lab (or
/// the campus) has a preset of that name already.
pub fn insert(
    c: &mut DbConn,
    lab: Option<i64>,
    spec: &PresetSpec,
    by: &str,
) -> Result<Option<i64>, DbError> {
    let command = to_json(&spec.command)?;
    let sets = sets(spec);
    let insert = diesel::insert_into(app_presets::table).values((
        app_presets::lab_id.eq(lab),
        columns!(spec, &command, &sets, by),
    ));
    match crate::insert_returning_id!(c, insert, app_presets::id) {
        Ok(id) => Ok(Some(id)),
        Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Replaces preset `id`'s settings (its lab stays); false when another preset of its lab
/// has the new name.
pub fn update(c: &mut DbConn, id: i64, spec: &PresetSpec, by: &str) -> Result<bool, DbError> {
    let command = to_json(&spec.command)?;
    let sets = sets(spec);
    match diesel::update(app_presets::table.find(id))
        .set(columns!(spec, &command, &sets, by))
        .execute(c)
    {
        Ok(_) => Ok(true),
        Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

pub fn get(c: &mut DbConn, id: i64) -> Result<Option<PresetRow>, DbError> {
    Ok(app_presets::table
        .find(id)
        .select(PresetRow::as_select())
        .first(c)
        .optional()?)
}

pub fn delete(c: &mut DbConn, id: i64) -> Result<bool, DbError> {
    Ok(diesel::delete(app_presets::table.find(id)).execute(c)? > 0)
}

/// Campus presets first, then by lab, each by title (the same on both backends, which
/// sort NULLs apart).
fn sorted(mut rows: Vec<PresetRow>) -> Vec<PresetRow> {
    rows.sort_by(|a, b| {
        (a.lab_id.is_some(), a.lab_id, &a.title, &a.name).cmp(&(
            b.lab_id.is_some(),
            b.lab_id,
            &b.title,
            &b.name,
        ))
    });
    rows
}

/// The campus's presets and those of `labs`.
pub fn usable_by(c: &mut DbConn, labs: &[i64]) -> Result<Vec<PresetRow>, DbError> {
    Ok(sorted(
        app_presets::table
            .filter(
                app_presets::lab_id
                    .is_null()
                    .or(app_presets::lab_id.eq_any(labs)),
            )
            .select(PresetRow::as_select())
            .load(c)?,
    ))
}

/// Every preset (operators' view).
pub fn all(c: &mut DbConn) -> Result<Vec<PresetRow>, DbError> {
    Ok(sorted(
        app_presets::table.select(PresetRow::as_select()).load(c)?,
    ))
}
