//! Saved job templates: a user's submit-form fields under a name (JSON text).

use super::schema::*;
use super::DbError;
use super::{now, DbConn};
use diesel::prelude::*;

#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = job_templates)]
pub struct JobTemplate {
    pub id: i64,
    pub user_id: i64,
    pub name: String,
    /// The form's fields as JSON.
    pub form: String,
    pub created_at: chrono::NaiveDateTime,
}

/// The user's templates, by name.
pub fn list(c: &mut DbConn, user: i64) -> Result<Vec<JobTemplate>, DbError> {
    Ok(job_templates::table
        .filter(job_templates::user_id.eq(user))
        .order(job_templates::name)
        .select(JobTemplate::as_select())
        .load(c)?)
}

/// Template `id` if it is `user`'s.
pub fn own(c: &mut DbConn, user: i64, id: i64) -> Result<Option<JobTemplate>, DbError> {
    Ok(job_templates::table
        .find(id)
        .filter(job_templates::user_id.eq(user))
        .select(JobTemplate::as_select())
        .first(c)
        .optional()?)
}

/// Saves `form` under `name` for `user`, replacing a template of that name; its id.
/// Run inside a transaction.
pub fn save(c: &mut DbConn, user: i64, name: &str, form: &str) -> Result<i64, DbError> {
    let existing: Option<i64> = job_templates::table
        .filter(job_templates::user_id.eq(user))
        .filter(job_templates::name.eq(name))
        .select(job_templates::id)
        .first(c)
        .optional()?;
    if let Some(id) = existing {
        diesel::update(job_templates::table.find(id))
            .set(job_templates::form.eq(form))
            .execute(c)?;
        return Ok(id);
    }
    let insert = diesel::insert_into(job_templates::table).values((
        job_templates::user_id.eq(user),
        job_templates::name.eq(name),
        job_templates::form.eq(form),
        job_templates::created_at.eq(now()),
    ));
    Ok(crate::insert_returning_id!(c, insert, job_templates::id)?)
}

/// How many templates `user` has.
pub fn count(c: &mut DbConn, user: i64) -> Result<i64, DbError> {
    Ok(job_templates::table
        .filter(job_templates::user_id.eq(user))
        .count()
        .get_result(c)?)
}

/// Deletes template `id` of `user`; false when there was none.
pub fn delete_own(c: &mut DbConn, user: i64, id: i64) -> Result<bool, DbError> {
    Ok(diesel::delete(
        job_templates::table
            .find(id)
            .filter(job_templates::user_id.eq(user)),
    )
    .execute(c)?
        > 0)
}
