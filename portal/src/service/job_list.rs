//! The jobs list: the caller's own jobs, a lab's jobs (its admins and operators), or
//! every job (operators), with filters, search, order and pages.
//!
//! Invariants:
//! - The scope is checked before anything is read: a lab scope goes through
//!   [`super::lab_admin`] (403 for a lab one does not administer, 404 for an unknown
//!   one), the campus scope needs an operator.
//! - Unknown filter values are refused naming the field (400), never ignored.

use super::jobs::LabJobView;
use super::views::job_views;
use super::{lab_admin, Actor, Ctx};
use crate::db::job_search::{JobFilter, Owner, Sort};
use crate::db::{self, DbConn};
use crate::domain::{JobKind, JobState};
use crate::error::AppError;
use commons_api::flows::NameFilter;

/// Jobs per page.
pub const PAGE_SIZE: i64 = 25;

/// Whose jobs the list shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Mine,
    Lab(String),
    All,
}

impl Scope {
    /// `mine`, `all`, or `lab:SLUG`; empty is `mine`.
    pub fn parse(s: &str) -> Result<Scope, AppError> {
        match s.trim() {
            "" | "mine" => Ok(Scope::Mine),
            "all" => Ok(Scope::All),
            other => other
                .strip_prefix("lab:")
                .filter(|l| !l.is_empty())
                .map(|l| Scope::Lab(l.to_string()))
                .ok_or_else(|| AppError::invalid("scope", "scope: mine, all or lab:SLUG")),
        }
    }

    pub fn as_param(&self) -> String {
        match self {
            Scope::Mine => "mine".into(),
            Scope::All => "all".into(),
            Scope::Lab(l) => format!("lab:{l}"),
        }
    }
}

/// The list's request, as typed in the filter form (empty: no filter).
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub scope: String,
    pub state: String,
    pub lab: String,
    pub kind: String,
    pub q: String,
    /// The name (with a trailing `*`: its beginning).
    pub name: String,
    /// `key=value` tags the jobs must all have.
    pub tags: Vec<String>,
    /// Only the tasks of this array (its id); otherwise an array is one row.
    pub array: String,
    pub sort: String,
    pub page: String,
}

/// One page of the list.
#[derive(Debug, Clone)]
pub struct JobList {
    pub scope: Scope,
    pub jobs: Vec<LabJobView>,
    pub total: i64,
    /// 1-based.
    pub page: i64,
    pub pages: i64,
    /// Every lab's slug (the lab filter's choices).
    pub labs: Vec<String>,
    /// The arrays whose first task stands for them in `jobs`, by id.
    pub arrays: std::collections::BTreeMap<i64, super::arrays::Summary>,
}

fn parse_state(s: &str) -> Result<Vec<JobState>, AppError> {
    match s.trim() {
        "" => Ok(vec![]),
        "active" => Ok(vec![
            JobState::Queued,
            JobState::Starting,
            JobState::Running,
            JobState::Preempting,
        ]),
        "finished" => Ok(vec![
            JobState::Succeeded,
            JobState::Failed,
            JobState::Cancelled,
        ]),
        other => other.parse::<JobState>().map(|s| vec![s]).map_err(|_| {
            AppError::invalid("state", format!("state: {other:?} is not a job state"))
        }),
    }
}

fn parse_sort(s: &str) -> Result<Sort, AppError> {
    match s.trim() {
        "" | "newest" => Ok(Sort::Newest),
        "oldest" => Ok(Sort::Oldest),
        "state" => Ok(Sort::State),
        "gpus" => Ok(Sort::Gpus),
        other => Err(AppError::invalid(
            "sort",
            format!("sort: {other:?} is none of newest, oldest, state, gpus"),
        )),
    }
}

fn parse_kind(kind: &str) -> Result<Option<JobKind>, AppError> {
    match kind.trim() {
        "" => Ok(None),
        k => k
            .parse::<JobKind>()
            .map(Some)
            .map_err(|_| AppError::invalid("kind", "kind: batch or interactive")),
    }
}

fn parse_page(page: &str) -> Result<i64, AppError> {
    match page.trim() {
        "" => Ok(1),
        p => p
            .parse()
            .ok()
            .filter(|p| *p >= 1)
            .ok_or_else(|| AppError::invalid("page", "page: a page number from 1")),
    }
}

/// The name filter and the `(key, value)` tags a job must have.
type FlowFilters = (Option<NameFilter>, Vec<(String, String)>);

/// The name and tag filters (`?name=`, `?tag=k=v`); empty ones are left out.
pub fn parse_flows(name: &str, tags: &[String]) -> Result<FlowFilters, AppError> {
    let name = match name.trim() {
        "" => None,
        n => Some(NameFilter::parse(n)?),
    };
    let tags = tags
        .iter()
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .map(|t| commons_api::flows::parse_tag("tag", t))
        .collect::<Result<Vec<_>, _>>()?;
    if tags.len() > commons_api::flows::MAX_TAGS {
        return Err(AppError::invalid("tag", "filter by at most 16 tags"));
    }
    Ok((name, tags))
}

/// Whose jobs the scope shows, if the actor may see them.
fn owner(c: &mut DbConn, actor: &Actor, scope: &Scope) -> Result<Owner, AppError> {
    Ok(match scope {
        Scope::Mine => Owner::User(actor.user.id),
        Scope::Lab(slug) => Owner::Lab(lab_admin(c, actor, slug)?.lab().id),
        Scope::All => {
            actor.require_operator()?;
            Owner::Everyone
        }
    })
}

/// The lab filter: none, or a lab that exists.
fn lab_filter(c: &mut DbConn, slug: &str) -> Result<Option<i64>, AppError> {
    if slug.is_empty() {
        return Ok(None);
    }
    let lab = db::users::find_lab(c, slug)?
        .ok_or_else(|| AppError::invalid("lab", format!("lab: no lab named {slug:?}")))?;
    Ok(Some(lab.id))
}

/// One page of the jobs `actor` asked for.
pub async fn list(ctx: &Ctx, actor: &Actor, query: ListQuery) -> Result<JobList, AppError> {
    let scope = Scope::parse(&query.scope)?;
    let states = parse_state(&query.state)?;
    let sort = parse_sort(&query.sort)?;
    let kind = parse_kind(&query.kind)?;
    let page = parse_page(&query.page)?;
    let array = super::arrays::parse_filter(&query.array)?;
    let (name, tags) = parse_flows(&query.name, &query.tags)?;
    let text = Some(query.q.trim().to_string()).filter(|t| !t.is_empty());
    if text.as_ref().is_some_and(|t| t.len() > 200) {
        return Err(AppError::invalid("q", "search (q): at most 200 characters"));
    }
    let actor = actor.clone();
    let lab_slug = query.lab.trim().to_string();
    ctx.db
        .run(move |c| {
            let owner = owner(c, &actor, &scope)?;
            let lab = lab_filter(c, &lab_slug)?;
            // With a state filter each task is judged alone.
            let collapse_arrays = array.is_none() && states.is_empty();
            let filter = JobFilter {
                owner,
                states,
                lab,
                kind,
                text,
                name,
                tags,
                collapse_arrays,
                array,
                sort,
            };
            let (rows, total) =
                db::job_search::search(c, &filter, (page - 1) * PAGE_SIZE, PAGE_SIZE)?;
            let users: Vec<i64> = rows.iter().map(|j| j.user_id).collect();
            let names = db::users::usernames(c, &users)?;
            let jobs = job_views(c, &rows)?
                .into_iter()
                .zip(&rows)
                .map(|(job, row)| LabJobView {
                    user: names.get(&row.user_id).cloned().unwrap_or_default(),
                    job,
                })
                .collect();
            let labs = db::users::all_lab_slugs(c)?
                .into_iter()
                .map(|(_, s)| s)
                .collect();
            let arrays = if filter.collapse_arrays {
                super::arrays::summaries(c, &rows)?
            } else {
                Default::default()
            };
            Ok(JobList {
                arrays,
                labs,
                scope,
                jobs,
                total,
                page,
                pages: ((total + PAGE_SIZE - 1) / PAGE_SIZE).max(1),
            })
        })
        .await
}

/// The API's filtered list (`GET /api/v1/jobs?name=..&tag=k=v`): at most `limit` of the
/// scope's jobs with that name and all those tags, newest first.
pub async fn filtered(
    ctx: &Ctx,
    actor: &Actor,
    scope: Scope,
    name: &str,
    tags: &[String],
    limit: i64,
) -> Result<Vec<LabJobView>, AppError> {
    let (name, tags) = parse_flows(name, tags)?;
    let actor = actor.clone();
    ctx.db
        .run(move |c| {
            let filter = JobFilter {
                owner: owner(c, &actor, &scope)?,
                states: Vec::new(),
                lab: None,
                kind: None,
                text: None,
                name,
                tags,
                array: None,
                collapse_arrays: false,
                sort: Sort::Newest,
            };
            let (rows, _) = db::job_search::search(c, &filter, 0, limit)?;
            let users: Vec<i64> = rows.iter().map(|j| j.user_id).collect();
            let names = db::users::usernames(c, &users)?;
            Ok(job_views(c, &rows)?
                .into_iter()
                .zip(&rows)
                .map(|(job, row)| LabJobView {
                    user: names.get(&row.user_id).cloned().unwrap_or_default(),
                    job,
                })
                .collect())
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_and_filters_parse_or_name_their_field() {
        assert_eq!(Scope::parse("").unwrap(), Scope::Mine);
        assert_eq!(
            Scope::parse("lab:vision").unwrap(),
            Scope::Lab("vision".into())
        );
        assert_eq!(Scope::parse("all").unwrap().as_param(), "all");
        assert_eq!(Scope::parse("lab:").unwrap_err().field(), Some("scope"));
        assert_eq!(parse_state("active").unwrap().len(), 4);
        assert_eq!(parse_state("running").unwrap(), vec![JobState::Running]);
        assert_eq!(parse_state("nope").unwrap_err().field(), Some("state"));
        assert_eq!(parse_sort("gpus").unwrap(), Sort::Gpus);
        assert_eq!(parse_sort("x").unwrap_err().field(), Some("sort"));
        let (name, tags) = parse_flows("sweep-*", &["lr=0.1".into(), " ".into()]).unwrap();
        assert_eq!(name, Some(NameFilter::StartsWith("sweep-".into())));
        assert_eq!(tags, vec![("lr".to_string(), "0.1".to_string())]);
        assert_eq!(
            parse_flows("", &["lr".into()]).unwrap_err().field(),
            Some("tag")
        );
        assert_eq!(
            parse_flows(&"x".repeat(200), &[]).unwrap_err().field(),
            Some("name")
        );
    }
}
