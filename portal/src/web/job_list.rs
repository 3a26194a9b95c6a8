//! The jobs list: scope (mine, a lab's for its admins, all for operators), filters by
//! state, lab and kind, search by image or command, order, pages. A plain GET form, so
//! every view of the list is a link.

use super::human::{self, When};
use super::Banner;
use crate::auth::{CsrfForm, CurrentUser, NoFields};
use crate::error::WebError;
use crate::service::job_list::{self, JobList, ListQuery, Scope};
use crate::service::jobs::LabJobView;
use crate::state::AppState;
use actix_session::Session;
use actix_web::{web, HttpResponse};
use askama::Template;
use serde::Deserialize;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/jobs", web::get().to(list))
        .route("/arrays/{id}/cancel", web::post().to(cancel_array));
}

/// Cancels every unfinished task of an array (the button on its list of tasks), then
/// shows that list again.
async fn cancel_array(
    state: web::Data<AppState>,
    user: CurrentUser,
    id: web::Path<i64>,
    _form: CsrfForm<NoFields>,
) -> Result<HttpResponse, WebError> {
    let id = id.into_inner();
    crate::service::arrays::cancel(&state, &user, id).await?;
    Ok(HttpResponse::SeeOther()
        .insert_header(("location", format!("/jobs?array={id}")))
        .finish())
}

/// The filter form's fields as typed (all optional).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ListForm {
    scope: String,
    state: String,
    lab: String,
    kind: String,
    q: String,
    /// The name (`sweep-*`: its beginning).
    name: String,
    /// One `key=value` tag.
    tag: String,
    /// Only this array's tasks (its id).
    array: String,
    sort: String,
    page: String,
}

impl ListForm {
    /// This list's link with `sort` and `page` changed (empty fields left out).
    fn link(&self, sort: &str, page: i64) -> String {
        let mut s = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in [
            ("scope", self.scope.as_str()),
            ("state", &self.state),
            ("lab", &self.lab),
            ("kind", &self.kind),
            ("q", &self.q),
            ("name", &self.name),
            ("tag", &self.tag),
            ("array", &self.array),
            ("sort", sort),
        ] {
            if !v.trim().is_empty() {
                s.append_pair(k, v.trim());
            }
        }
        if page > 1 {
            s.append_pair("page", &page.to_string());
        }
        format!("/jobs?{}", s.finish())
    }
}

/// One row as shown.
struct Row {
    v: LabJobView,
    submitted: When,
    /// While waiting: when it should start ("in 12 min (…)", or "unknown").
    estimated: Option<String>,
    /// The array this row stands for (its first task's row), with its counts.
    array: Option<crate::service::arrays::Summary>,
}

/// A choice of scope above the list.
struct ScopeLink {
    href: String,
    label: String,
    current: bool,
}

/// An option of a filter's select.
struct Choice {
    value: String,
    label: String,
    selected: bool,
}

impl Choice {
    fn list<'a>(options: impl IntoIterator<Item = (&'a str, &'a str)>, typed: &str) -> Vec<Choice> {
        options
            .into_iter()
            .map(|(value, label)| Choice {
                selected: typed.trim() == value,
                value: value.to_string(),
                label: label.to_string(),
            })
            .collect()
    }
}

/// The state filter's choices.
const STATES: [(&str, &str); 7] = [
    ("active", "waiting or running"),
    ("queued", "queued"),
    ("running", "running"),
    ("finished", "finished"),
    ("succeeded", "succeeded"),
    ("failed", "failed"),
    ("cancelled", "cancelled"),
];

/// A sortable column's header link.
struct SortLink {
    href: String,
    label: &'static str,
    current: bool,
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct JobsPage {
    banner: Banner,
    form: ListForm,
    list: JobList,
    rows: Vec<Row>,
    scopes: Vec<ScopeLink>,
    sorts: Vec<SortLink>,
    state_choices: Vec<Choice>,
    lab_choices: Vec<Choice>,
    prev: Option<String>,
    next: Option<String>,
    /// The list shows other people's jobs (a user column).
    others: bool,
    /// The session's form token (the array's cancel button).
    csrf: String,
    heading: String,
}

fn rows(list: &JobList, now: chrono::NaiveDateTime, offset: i32) -> Vec<Row> {
    list.jobs
        .iter()
        .map(|v| Row {
            submitted: When::new(v.job.created_at, now, offset),
            estimated: v.job.estimated_start_at.map(|e| match e {
                Some(t) => format!("{} ({})", human::ago(t, now), human::at(t, offset)),
                None => "unknown".to_string(),
            }),
            array: v.job.array_id.and_then(|a| list.arrays.get(&a).cloned()),
            v: v.clone(),
        })
        .collect()
}

/// My jobs, then each administered lab's, then (operators) all.
fn scope_links(banner: &Banner, current: &Scope) -> Vec<ScopeLink> {
    let mut scopes = vec![ScopeLink {
        href: "/jobs".into(),
        label: "My jobs".into(),
        current: *current == Scope::Mine,
    }];
    for l in &banner.admin_labs {
        let scope = Scope::Lab(l.clone());
        scopes.push(ScopeLink {
            href: format!("/jobs?scope={}", scope.as_param()),
            label: format!("Lab {l}"),
            current: *current == scope,
        });
    }
    if banner.operator {
        scopes.push(ScopeLink {
            href: "/jobs?scope=all".into(),
            label: "All jobs".into(),
            current: *current == Scope::All,
        });
    }
    scopes
}

fn sort_links(form: &ListForm) -> Vec<SortLink> {
    let current_sort = if form.sort.is_empty() {
        "newest"
    } else {
        form.sort.as_str()
    };
    [
        ("newest", "Newest"),
        ("oldest", "Oldest"),
        ("state", "State"),
        ("gpus", "Most GPUs"),
    ]
    .into_iter()
    .map(|(key, label)| SortLink {
        href: form.link(key, 1),
        label,
        current: current_sort == key,
    })
    .collect()
}

async fn list(
    state: web::Data<AppState>,
    session: Session,
    user: CurrentUser,
    form: web::Query<ListForm>,
) -> Result<HttpResponse, WebError> {
    let form = form.into_inner();
    let banner = Banner::new(&state, &session, Some(&user));
    let query = ListQuery {
        scope: form.scope.clone(),
        state: form.state.clone(),
        lab: form.lab.clone(),
        kind: form.kind.clone(),
        q: form.q.clone(),
        name: form.name.clone(),
        tags: vec![form.tag.clone()],
        array: form.array.clone(),
        sort: form.sort.clone(),
        page: form.page.clone(),
    };
    let list = job_list::list(&state, &user, query).await?;
    let now = crate::db::now();
    let offset = state.config.policy.utc_offset_s;
    let rows = rows(&list, now, offset);
    let scopes = scope_links(&banner, &list.scope);
    let sorts = sort_links(&form);
    let sort = form.sort.clone();
    let page = JobsPage {
        csrf: crate::auth::csrf_token(&session),
        prev: (list.page > 1).then(|| form.link(&sort, list.page - 1)),
        next: (list.page < list.pages).then(|| form.link(&sort, list.page + 1)),
        others: list.scope != Scope::Mine,
        heading: match &list.scope {
            Scope::Mine => "My jobs".into(),
            Scope::Lab(l) => format!("Jobs of lab {l}"),
            Scope::All => "All jobs".into(),
        },
        state_choices: Choice::list(STATES, &form.state),
        lab_choices: Choice::list(
            list.labs.iter().map(|l| (l.as_str(), l.as_str())),
            &form.lab,
        ),
        banner,
        form,
        rows,
        scopes,
        sorts,
        list,
    };
    super::html(&page)
}
