//! The workflow flags of `commons run` (`--name`, `--tag`, `--after-ok`, ...) and of `commons ls` (the
//! filters `--name`, `--tag`), checked with the portal's own rules before anything is
//! sent.

use crate::error::Result;
use clap::Args;
use commons_api::JobRequest;

/// `commons run`'s flags for finding the job again.
#[derive(Debug, Args)]
pub struct RunFlows {
    /// A name for the job (at most 128 characters), shown in lists.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Which of this job's events to notify about, instead of your settings: started,
    /// preempted, succeeded, failed, cancelled, or start, end, fail, all (`end,fail`).
    #[arg(long, value_name = "EVENTS", value_delimiter = ',')]
    pub notify: Option<Vec<String>>,
    /// A tag, KEY=VALUE (repeat for several, at most 16).
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    pub tags: Vec<String>,
    /// Start only after job ID has succeeded (repeat for several); if it fails or is
    /// cancelled, this job fails at once, saying why.
    #[arg(long, value_name = "ID")]
    pub after_ok: Vec<i64>,
    /// Start only after job ID has failed (a clean-up or a retry).
    #[arg(long, value_name = "ID")]
    pub after_fail: Vec<i64>,
    /// Start after job ID has ended, however it ended.
    #[arg(long, value_name = "ID")]
    pub after_any: Vec<i64>,
    /// Start only after every task of array ARRAY has succeeded; if one fails or is
    /// cancelled, this job fails at once.
    #[arg(long, value_name = "ARRAY")]
    pub after_ok_array: Vec<i64>,
    /// With --array: task k starts only after task k of array ARRAY (the same indices)
    /// has succeeded, and fails at once if it failed or was cancelled.
    #[arg(long, value_name = "ARRAY")]
    pub after_ok_per_index: Vec<i64>,
    /// Make an array of tasks, e.g. 0-99%8 (at most 8 at once), 1,3,5-9 or 0-98:2; each
    /// task sees COMMONS_ARRAY_INDEX, and {index} in the command is replaced.
    #[arg(long, value_name = "SPEC")]
    pub array: Option<String>,
}

/// `commons ls`'s filters.
#[derive(Debug, Args)]
pub struct LsFilters {
    /// Only jobs with this name (ignoring case); `sweep-*`: names that begin so.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Only jobs with this tag, KEY=VALUE (repeat: jobs with all of them).
    #[arg(long = "tag", value_name = "KEY=VALUE")]
    pub tags: Vec<String>,
    /// Only the tasks of this array, one line each (otherwise an array is one line).
    #[arg(long, value_name = "ARRAY")]
    pub array: Option<i64>,
}

/// A line of `commons ls`: a job, or an array's tasks as one line.
pub enum Listed {
    Job(commons_api::JobView, Option<String>),
    Array {
        id: i64,
        /// Its first task listed (its name, image, lab and age stand for the array).
        first: commons_api::JobView,
        user: Option<String>,
        /// How many of its listed tasks are in each state.
        states: std::collections::BTreeMap<commons_api::JobState, usize>,
    },
}

impl Listed {
    /// "3 running, 17 queued".
    pub fn counts(states: &std::collections::BTreeMap<commons_api::JobState, usize>) -> String {
        let parts: Vec<String> = states.iter().map(|(s, n)| format!("{n} {s}")).collect();
        parts.join(", ")
    }
}

/// The jobs as lines: each array's tasks as one line, where its first task was.
pub fn group_arrays(rows: Vec<(commons_api::JobView, Option<String>)>) -> Vec<Listed> {
    let mut out: Vec<Listed> = Vec::new();
    let mut at: std::collections::BTreeMap<i64, usize> = std::collections::BTreeMap::new();
    for (j, user) in rows {
        let Some(id) = j.array_id else {
            out.push(Listed::Job(j, user));
            continue;
        };
        match at.get(&id) {
            Some(&i) => {
                if let Listed::Array { states, .. } = &mut out[i] {
                    *states.entry(j.state).or_default() += 1;
                }
            }
            None => {
                at.insert(id, out.len());
                let states = std::collections::BTreeMap::from([(j.state, 1)]);
                out.push(Listed::Array {
                    id,
                    first: j,
                    user,
                    states,
                });
            }
        }
    }
    out
}

/// Puts the flags into the request.
pub fn apply(f: &RunFlows, req: &mut JobRequest) -> Result<()> {
    req.name = f.name.clone();
    if let Some(n) = &f.notify {
        commons_api::notify::events("notify", n)?;
        req.notify = Some(n.clone());
    }
    req.array = f.array.clone();
    for t in &f.tags {
        let (k, v) = commons_api::flows::parse_tag("tags", t)?;
        req.tags.insert(k, v);
    }
    use commons_api::flows::{After, When};
    for (ids, when) in [
        (&f.after_ok, When::Ok),
        (&f.after_fail, When::Fail),
        (&f.after_any, When::Any),
    ] {
        req.after
            .extend(ids.iter().map(|&job| After::job(job, when)));
    }
    req.after
        .extend(f.after_ok_array.iter().map(|&a| After::array(a, When::Ok)));
    req.after.extend(
        f.after_ok_per_index
            .iter()
            .map(|&a| After::per_index(a, When::Ok)),
    );
    Ok(())
}

/// Says what an array's submission made: its id on standard output, its tasks on
/// standard error.
pub fn array_submitted(a: &commons_api::array::ArrayView) -> u8 {
    let last = a.tasks.last().copied().unwrap_or(a.first_job);
    eprintln!(
        "array {} submitted: {} tasks (jobs {}..{}); `commons cancel --array {}` cancels them all",
        a.id, a.count, a.first_job, last, a.id
    );
    println!("{}", a.id);
    0
}

/// Cancels every unfinished task of `array`; says the counts by state then.
pub fn cancel_array(client: &crate::client::Client, array: i64) -> Result<()> {
    let a: commons_api::array::ArrayView = client.post(
        &format!("/api/v1/arrays/{array}/cancel"),
        &serde_json::json!({}),
    )?;
    let counts: Vec<String> = a.states.iter().map(|(s, n)| format!("{n} {s}")).collect();
    println!("array {array}: {}", counts.join(", "));
    Ok(())
}

/// `path` with the filters added to its query string, checked first.
pub fn list_path(path: &str, f: &LsFilters) -> Result<String> {
    let pairs = query(f)?;
    if pairs.is_empty() {
        return Ok(path.to_string());
    }
    let mut s = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, &v);
    }
    let sep = if path.contains('?') { '&' } else { '?' };
    Ok(format!("{path}{sep}{}", s.finish()))
}

/// The filters as query parameters (`name=..&tag=..`), empty when none; checked first.
pub fn query(f: &LsFilters) -> Result<Vec<(&'static str, String)>> {
    let mut q = Vec::new();
    if let Some(n) = &f.name {
        commons_api::flows::NameFilter::parse(n)?;
        q.push(("name", n.clone()));
    }
    for t in &f.tags {
        commons_api::flows::parse_tag("tag", t)?;
        q.push(("tag", t.clone()));
    }
    if let Some(a) = f.array {
        q.push(("array", a.to_string()));
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_become_fields_and_bad_ones_name_theirs() {
        let mut req = JobRequest::new("x:1", 1, 5);
        let f = RunFlows {
            name: Some("sweep".into()),
            notify: Some(vec!["end".into(), "fail".into()]),
            tags: vec!["lr=0.1".into(), "seed=3".into()],
            after_ok: vec![41],
            after_fail: vec![],
            after_any: vec![40],
            after_ok_array: vec![7],
            after_ok_per_index: vec![8],
            array: Some("0-9%2".into()),
        };
        apply(&f, &mut req).unwrap();
        assert_eq!(req.name.as_deref(), Some("sweep"));
        assert_eq!(req.notify, Some(vec!["end".into(), "fail".into()]));
        assert_eq!(req.array.as_deref(), Some("0-9%2"));
        assert_eq!(req.tags["seed"], "3");
        assert_eq!(
            serde_json::to_value(&req.after).unwrap(),
            serde_json::json!([{"job": 41, "when": "ok"}, {"job": 40, "when": "any"},
                {"array": 7, "when": "ok"}, {"array": 8, "when": "ok", "per_index": true}])
        );
        let bad = RunFlows {
            name: None,
            notify: None,
            tags: vec!["lr".into()],
            after_ok: vec![],
            after_fail: vec![],
            after_any: vec![],
            after_ok_array: vec![],
            after_ok_per_index: vec![],
            array: None,
        };
        let e = apply(&bad, &mut req).unwrap_err();
        assert!(matches!(e, crate::error::CliError::Invalid { field, .. } if field == "tags"));
        let bad = RunFlows {
            name: None,
            notify: Some(vec!["finish".into()]),
            tags: vec![],
            after_ok: vec![],
            after_fail: vec![],
            after_any: vec![],
            after_ok_array: vec![],
            after_ok_per_index: vec![],
            array: None,
        };
        let e = apply(&bad, &mut req).unwrap_err();
        assert!(matches!(e, crate::error::CliError::Invalid { field, .. } if field == "notify"));
        let q = query(&LsFilters {
            name: Some("sweep-*".into()),
            tags: vec!["lr=0.1".into()],
            array: None,
        })
        .unwrap();
        assert_eq!(
            q,
            vec![
                ("name", "sweep-*".to_string()),
                ("tag", "lr=0.1".to_string())
            ]
        );
        let f = LsFilters {
            name: None,
            tags: vec!["opt=a+b%".into()],
            array: None,
        };
        assert_eq!(
            list_path("/api/v1/jobs?lab=vision", &f).unwrap(),
            "/api/v1/jobs?lab=vision&tag=opt%3Da%2Bb%25"
        );
    }

    #[test]
    fn an_arrays_tasks_are_one_line_where_its_first_was() {
        let job = |id: i64, array: Option<i64>, state: &str| -> commons_api::JobView {
            serde_json::from_value(serde_json::json!({
                "id": id, "array_id": array, "state": state, "attempts": 0, "image": "x:1",
                "command": [], "gpus_requested": 1, "gpu_models": [],
                "time_limit_minutes": 5, "kind": "batch", "lab": "vision",
                "created_at": "2026-12-03T08:12:00.123456",
            }))
            .unwrap()
        };
        let rows = vec![
            (job(9, None, "queued"), None),
            (job(8, Some(2), "queued"), None),
            (job(7, Some(2), "running"), None),
            (job(6, None, "succeeded"), None),
            (job(5, Some(2), "running"), None),
        ];
        let lines = group_arrays(rows);
        assert_eq!(lines.len(), 3);
        match &lines[1] {
            Listed::Array {
                id, first, states, ..
            } => {
                assert_eq!((*id, first.id), (2, 8));
                assert_eq!(Listed::counts(states), "1 queued, 2 running");
            }
            Listed::Job(..) => panic!("the array's line is where its first task was"),
        }
    }
}
