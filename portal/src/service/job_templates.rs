//! Saved job templates: each user keeps submit forms under names and fills the form from
//! one later. A user sees and touches only their own (another's answers 404).

use super::{Actor, Ctx};
use crate::db::job_templates::JobTemplate;
use crate::db::{self};
use crate::error::AppError;

/// Most templates one user keeps.
pub const MAX_TEMPLATES: i64 = 50;

/// A template's name: 1 to 64 characters, no control characters.
fn check_name(name: &str) -> Result<String, AppError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 64 || name.chars().any(char::is_control) {
        return Err(AppError::invalid(
            "template_name",
            "name the template: 1 to 64 characters",
        ));
    }
    Ok(name.to_string())
}

/// Saves `form` (the form's fields as JSON) under `name`, replacing the actor's template
/// of that name; its id.
pub async fn save(ctx: &Ctx, actor: &Actor, name: &str, form: String) -> Result<i64, AppError> {
    let name = check_name(name)?;
    let user = actor.user.id;
    ctx.db
        .run(move |c| {
            db::transaction(c, |c| {
                let replacing = db::job_templates::list(c, user)?
                    .iter()
                    .any(|t| t.name == name);
                if !replacing && db::job_templates::count(c, user)? >= MAX_TEMPLATES {
                    return Err(AppError::invalid(
                        "template_name",
                        format!("at most {MAX_TEMPLATES} templates: delete one first"),
                    ));
                }
                Ok(db::job_templates::save(c, user, &name, &form)?)
            })
        })
        .await
}

/// The actor's templates, by name.
pub async fn list(ctx: &Ctx, actor: &Actor) -> Result<Vec<JobTemplate>, AppError> {
    let user = actor.user.id;
    Ok(ctx
        .db
        .run(move |c| db::job_templates::list(c, user))
        .await?)
}

/// One of the actor's templates.
pub async fn get(ctx: &Ctx, actor: &Actor, id: i64) -> Result<JobTemplate, AppError> {
    let user = actor.user.id;
    ctx.db
        .run(move |c| db::job_templates::own(c, user, id))
        .await?
        .ok_or(AppError::NotFound("template"))
}

/// Deletes one of the actor's templates.
pub async fn delete(ctx: &Ctx, actor: &Actor, id: i64) -> Result<(), AppError> {
    let user = actor.user.id;
    if ctx
        .db
        .run(move |c| db::job_templates::delete_own(c, user, id))
        .await?
    {
        Ok(())
    } else {
        Err(AppError::NotFound("template"))
    }
}

#[cfg(test)]
mod tests {
    use super::check_name;

    #[test]
    fn template_names_are_short_and_printable() {
        assert_eq!(check_name("  train resnet ").unwrap(), "train resnet");
        for bad in ["", "   ", "a\nb", &"x".repeat(65)] {
            assert_eq!(check_name(bad).unwrap_err().field(), Some("template_name"));
        }
    }
}
