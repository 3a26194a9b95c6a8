//! The jobs list's query: jobs of one user, one lab or the whole campus, filtered by
//! state, lab and kind, searched by image or command, sorted, one page at a time. The
//! same query counts the matches, so the pager and the rows agree.

use super::models::{Job, JobKind, JobState};
use super::schema::*;
use super::DbConn;
use super::DbError;
use diesel::prelude::*;

diesel::define_sql_function!(fn lower(x: diesel::sql_types::Text) -> diesel::sql_types::Text);

/// Whose jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    User(i64),
    Lab(i64),
    Everyone,
}

/// The list's order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Sort {
    #[default]
    Newest,
    Oldest,
    State,
    Gpus,
}

#[derive(Debug, Clone)]
pub struct JobFilter {
    pub owner: Owner,
    pub states: Vec<JobState>,
    pub lab: Option<i64>,
    pub kind: Option<JobKind>,
    /// Text the image, the command or the name contains (any case).
    pub text: Option<String>,
    /// The name, whole or its beginning (`NameFilter`).
    pub name: Option<commons_api::flows::NameFilter>,
    /// Tags the job must all have, `(key, value)`.
    pub tags: Vec<(String, String)>,
    /// Only the tasks of this array.
    pub array: Option<i64>,
    /// An array's tasks as one row: only its first task stands for it.
    pub collapse_arrays: bool,
    pub sort: Sort,
}

/// `text` as a LIKE pattern, its wildcards escaped (no `%` added).
fn escape_like(text: &str) -> String {
    let mut p = String::new();
    for ch in text.chars() {
        if matches!(ch, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(ch);
    }
    p
}

/// The pattern that finds tag `key=value` in the stored JSON object: keys and values
/// hold no quote or backslash (`commons_api::flows::tag`), so `"key":"value"` occurs in
/// the object's text exactly when the job has that tag.
fn tag_pattern(key: &str, value: &str) -> String {
    let text = format!("\"{key}\":\"{value}\"").to_lowercase();
    format!("%{}%", escape_like(&text))
}

/// `text` as a LIKE pattern that matches it anywhere, its wildcards escaped.
fn contains_pattern(text: &str) -> String {
    let mut p = String::from("%");
    for ch in text.to_lowercase().chars() {
        if matches!(ch, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(ch);
    }
    p.push('%');
    p
}

// The same filters for the count and the page: a macro, because the boxed query's
// backend type is inferred where it runs.
macro_rules! apply_filter {
    ($q:expr, $f:expr) => {{
        let f: &JobFilter = $f;
        let mut q = $q;
        q = match f.owner {
            Owner::User(u) => q.filter(jobs::user_id.eq(u)),
            Owner::Lab(l) => q.filter(jobs::lab_id.eq(l)),
            Owner::Everyone => q,
        };
        if !f.states.is_empty() {
            q = q.filter(jobs::state.eq_any(f.states.clone()));
        }
        if let Some(l) = f.lab {
            q = q.filter(jobs::lab_id.eq(l));
        }
        if let Some(k) = f.kind {
            q = q.filter(jobs::kind.eq(k));
        }
        if let Some(t) = f.text.as_deref().filter(|t| !t.trim().is_empty()) {
            let p = contains_pattern(t.trim());
            q = q.filter(
                lower(jobs::image)
                    .like(p.clone())
                    .escape('\\')
                    .or(lower(jobs::command).like(p.clone()).escape('\\'))
                    .or(lower(jobs::name.assume_not_null()).like(p).escape('\\')),
            );
        }
        // Names and tags match ignoring case, alike on both backends (SQLite's LIKE
        // ignores ASCII case, PostgreSQL's does not).
        match &f.name {
            Some(commons_api::flows::NameFilter::Exactly(n)) => {
                q = q.filter(lower(jobs::name.assume_not_null()).eq(n.to_lowercase()));
            }
            Some(commons_api::flows::NameFilter::StartsWith(n)) => {
                let p = format!("{}%", escape_like(&n.to_lowercase()));
                q = q.filter(lower(jobs::name.assume_not_null()).like(p).escape('\\'));
            }
            None => {}
        }
        for (k, v) in &f.tags {
            q = q.filter(lower(jobs::tags).like(tag_pattern(k, v)).escape('\\'));
        }
        if let Some(a) = f.array {
            q = q.filter(jobs::array_id.eq(a));
        }
        if f.collapse_arrays {
            q = q.filter(
                jobs::array_id.is_null().or(jobs::id
                    .nullable()
                    .eq_any(arrays::table.select(arrays::first_job))),
            );
        }
        q
    }};
}

/// One page of the matching jobs and how many match in all.
pub fn search(
    c: &mut DbConn,
    f: &JobFilter,
    offset: i64,
    limit: i64,
) -> Result<(Vec<Job>, i64), DbError> {
    let total: i64 = apply_filter!(jobs::table.into_boxed(), f)
        .count()
        .get_result(c)?;
    let q = apply_filter!(jobs::table.into_boxed(), f);
    let q = match f.sort {
        Sort::Newest => q.order(jobs::id.desc()),
        Sort::Oldest => q.order(jobs::id.asc()),
        Sort::State => q.order((jobs::state.asc(), jobs::id.desc())),
        Sort::Gpus => q.order((jobs::gpus.desc(), jobs::id.desc())),
    };
    let rows = q
        .offset(offset)
        .limit(limit)
        .select(Job::as_select())
        .load(c)?;
    Ok((rows, total))
}

#[cfg(test)]
mod tests {
    use super::{contains_pattern, tag_pattern};

    #[test]
    fn search_text_is_matched_literally() {
        assert_eq!(tag_pattern("Run_id", "a%"), "%\"run\\_id\":\"a\\%\"%");
        assert_eq!(contains_pattern("PyTorch"), "%pytorch%");
        assert_eq!(contains_pattern("50%_a\\b"), "%50\\%\\_a\\\\b%");
    }
}
