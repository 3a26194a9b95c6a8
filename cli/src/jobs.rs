//! Jobs: `run` and `submit` (checked with the portal's own rules before sending), `ls`,
//! `show`, `events`, `cancel`. Following a job is in `follow.rs`.

use crate::args::{CancelArgs, IdJson, LsArgs, RunArgs, SubmitArgs, SubmitFlags};
use crate::client::Client;
use crate::error::{CliError, Result};
use crate::follow;
use crate::output::{self, Cell};
use commons_api::{JobEvent, JobKind, JobRequest, JobState, JobView, LabJobView};
use serde_json::Value;
use std::io::Read;

/// What `ls` says beside the state: why it waits, time left, how it ended.
fn info(j: &JobView) -> String {
    match j.state {
        JobState::Queued => {
            let pos = j
                .queue_position
                .map(|p| format!("#{p} in queue"))
                .unwrap_or_default();
            match (&j.reason, pos.is_empty()) {
                (Some(r), false) => format!("{r} ({pos})"),
                (Some(r), true) => r.clone(),
                (None, _) => pos,
            }
        }
        JobState::Running | JobState::Preempting => j
            .time_left_s
            .map(|s| format!("{} left", output::duration(s)))
            .unwrap_or_default(),
        JobState::Failed => match (j.exit_code, &j.reason) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(r)) => r.clone(),
            (None, None) => String::new(),
        },
        JobState::Cancelled => j.reason.clone().unwrap_or_default(),
        JobState::Starting | JobState::Succeeded => String::new(),
    }
}

/// The GPUs it holds (`2x A100 [0,1]`), or else the ones it asks for (`2 A100|H100`).
fn gpu_text(j: &JobView) -> String {
    match &j.gpus {
        Some(g) if !g.is_empty() && !j.state.is_final() => {
            let idx: Vec<String> = g.iter().map(|g| g.index.to_string()).collect();
            format!("{}x {} [{}]", g.len(), g[0].model, idx.join(","))
        }
        _ => {
            let models = if j.gpu_models.is_empty() {
                String::new()
            } else {
                format!(" {}", j.gpu_models.join("|"))
            };
            format!("{}{models}", j.gpus_requested)
        }
    }
}

/// A job's exit status as this program's: the job's own exit code, 0 for success, and
/// 125 for a job that ended without one (cancelled, could not start).
pub fn exit_status(job: &JobView) -> u8 {
    match (job.state, job.exit_code) {
        (JobState::Succeeded, _) => 0,
        (JobState::Failed, Some(c)) => match c.rem_euclid(256) {
            0 => 1,
            n => n as u8,
        },
        _ => crate::error::exit::NO_EXIT_CODE,
    }
}

/// `KEY=VALUE` pairs into a map; a pair without `=` names the field `env`.
fn env_pairs(pairs: &[String]) -> Result<std::collections::BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| CliError::Invalid {
                    field: "env".into(),
                    message: format!("{p:?} is not KEY=VALUE (--env)"),
                })
        })
        .collect()
}

/// The request `commons run` makes of its flags.
pub fn run_request(a: &RunArgs) -> Result<JobRequest> {
    let mut req = JobRequest::new(&a.image, a.gpus, output::parse_minutes(&a.time)?);
    req.command = a.command.clone();
    req.env = env_pairs(&a.env)?;
    req.gpu_models = a.gpu_models.clone();
    req.min_gpu_memory_gb = a.gpu_memory;
    req.gpu_fraction = a.gpu_fraction;
    req.gpu_memory_gb = a.gpu_share_memory;
    req.cpus = a.cpus;
    req.memory_gb = a.memory;
    req.lab = a.lab.clone();
    req.checkpoint_minutes = a.checkpoint_minutes;
    req.disk_gb = a.disk;
    req.inputs = a.inputs.clone();
    req.datasets = a
        .datasets
        .iter()
        .map(|d| commons_api::datasets::parse_written(d))
        .collect::<std::result::Result<_, _>>()?;
    req.kind = if a.interactive {
        JobKind::Interactive
    } else {
        JobKind::Batch
    };
    crate::flows::apply(&a.flows, &mut req)?;
    Ok(req)
}

/// Reads a job file (TOML, the API's fields; unknown keys refused), naming the line and
/// the key at fault.
pub fn read_job_file(name: &str, text: &str) -> Result<JobRequest> {
    toml::from_str(text).map_err(|e| {
        let mut place = String::new();
        if let Some(span) = e.span() {
            let line_no = text[..span.start.min(text.len())].matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or_default();
            place = format!(" line {line_no}");
            if let Some((key, _)) = line.split_once('=') {
                let key = key.trim();
                if !key.is_empty() && !e.message().contains(&format!("`{key}`")) {
                    place.push_str(&format!(" ({key})"));
                }
            }
        }
        CliError::Usage(format!("{name}{place}: {}", e.message().trim()))
    })
}

fn submit_request(client: &Client, req: &JobRequest, flags: &SubmitFlags) -> Result<u8> {
    // The portal's own rules, before anything is sent.
    commons_api::job::check(req)?;
    let created: Value = client.post("/api/v1/jobs", req)?;
    if flags.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&created).unwrap_or_default()
        );
        return Ok(0);
    }
    if req.array.is_some() {
        let array: commons_api::array::ArrayView = client.parse(created)?;
        return Ok(crate::flows::array_submitted(&array));
    }
    let job: JobView = client.parse(created)?;
    if flags.follow {
        eprintln!(
            "job {} submitted; Ctrl-C stops following (the job keeps running; `commons cancel {}` stops it)",
            job.id, job.id
        );
        let end = follow::follow(client, job.id, true)?;
        return Ok(exit_status(&end));
    }
    eprintln!("job {} submitted ({})", job.id, job.state);
    println!("{}", job.id);
    Ok(0)
}

pub fn run(a: RunArgs) -> Result<u8> {
    let req = run_request(&a)?;
    commons_api::job::check(&req)?;
    let client = Client::signed_in()?;
    submit_request(&client, &req, &a.submit)
}

pub fn submit(a: SubmitArgs) -> Result<u8> {
    let (name, text) = if a.file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(|e| {
            CliError::Usage(format!("cannot read the job from standard input: {e}"))
        })?;
        ("standard input".to_string(), s)
    } else {
        let name = a.file.display().to_string();
        let text = std::fs::read_to_string(&a.file)
            .map_err(|e| CliError::Usage(format!("cannot read {name}: {e}")))?;
        (name, text)
    };
    let req = read_job_file(&name, &text)?;
    commons_api::job::check(&req)?;
    let client = Client::signed_in()?;
    submit_request(&client, &req, &a.submit)
}

pub fn ls(a: LsArgs) -> Result<u8> {
    let client = Client::signed_in()?;
    let path = if a.all {
        let lab = match a.lab {
            Some(l) => l,
            None => crate::info::only_admin_lab(&client)?,
        };
        commons_api::rules::slug("lab", &lab)?;
        format!("/api/v1/jobs?lab={lab}")
    } else {
        "/api/v1/jobs".to_string()
    };
    let path = crate::flows::list_path(&path, &a.filters)?;
    let all: Vec<Value> = client.get(&path)?;
    let wanted: Vec<JobState> = a
        .state
        .iter()
        .map(|s| s.parse::<JobState>())
        .collect::<std::result::Result<_, _>>()?;
    let mut shown = Vec::new();
    let mut rows = Vec::new();
    for v in all {
        // A lab's listing says whose each job is; the caller's own does not.
        let (j, user) = if a.all {
            let l: LabJobView = client.parse(v.clone())?;
            (l.job, Some(l.user))
        } else {
            (client.parse::<JobView>(v.clone())?, None)
        };
        if wanted.is_empty() || wanted.contains(&j.state) {
            shown.push(v);
            rows.push((j, user));
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&shown).unwrap_or_default()
        );
        return Ok(0);
    }
    if rows.is_empty() {
        eprintln!("no jobs");
        return Ok(0);
    }
    let colour = output::colour_stdout();
    let mut headers = vec!["ID"];
    if a.all {
        headers.push("USER");
    }
    headers.extend(["STATE", "AGE", "NAME/IMAGE", "GPUS", "NODE", "LAB", "INFO"]);
    let lines = if a.filters.array.is_some() {
        rows.into_iter()
            .map(|(j, u)| crate::flows::Listed::Job(j, u))
            .collect()
    } else {
        crate::flows::group_arrays(rows)
    };
    let rows = lines.into_iter().map(ls_row).collect();
    print!("{}", output::table(&headers, rows, colour));
    Ok(0)
}

/// One line of `commons ls`: a job, or an array's tasks.
fn ls_row(line: crate::flows::Listed) -> Vec<Cell> {
    let (j, user) = match line {
        crate::flows::Listed::Job(j, user) => (j, user),
        crate::flows::Listed::Array {
            id,
            first,
            user,
            states,
        } => return array_row(id, &first, user, &states),
    };
    let mut row: Vec<Cell> = vec![j.id.to_string().into()];
    if let Some(u) = user {
        row.push(u.into());
    }
    row.extend([
        Cell::state(j.state),
        output::ago(j.created_at).trim_end_matches(" ago").into(),
        j.name.as_deref().unwrap_or(&j.image).into(),
        gpu_text(&j).into(),
        j.node.clone().unwrap_or_default().into(),
        j.lab.as_str().into(),
        info(&j).into(),
    ]);
    row
}

/// An array's line in `commons ls`: `array-ID`, its tasks' counts by state.
fn array_row(
    id: i64,
    first: &JobView,
    user: Option<String>,
    states: &std::collections::BTreeMap<JobState, usize>,
) -> Vec<Cell> {
    let mut row: Vec<Cell> = vec![format!("array-{id}").into()];
    if let Some(u) = user {
        row.push(u.into());
    }
    let n: usize = states.values().sum();
    row.extend([
        crate::flows::Listed::counts(states).into(),
        output::ago(first.created_at)
            .trim_end_matches(" ago")
            .into(),
        first.name.as_deref().unwrap_or(&first.image).into(),
        format!("{} each", first.gpus_requested).into(),
        String::new().into(),
        first.lab.as_str().into(),
        format!("{n} tasks listed; commons ls --array {id}").into(),
    ]);
    row
}

pub fn show(a: IdJson) -> Result<u8> {
    let client = Client::signed_in()?;
    let v: Value = client.get(&format!("/api/v1/jobs/{}", a.id))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(0);
    }
    let j: JobView = client.parse(v)?;
    let lines = show_lines(&j, output::colour_stdout());
    let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in lines {
        println!("{k:width$}  {v}");
    }
    Ok(0)
}

/// The lines of `show` for a person, as (label, value).
fn show_lines(j: &JobView, colour: bool) -> Vec<(&'static str, String)> {
    let mut lines: Vec<(&str, String)> = vec![("job", j.id.to_string())];
    if let Some(n) = &j.name {
        lines.push(("name", n.clone()));
    }
    if !j.tags.is_empty() {
        let tags: Vec<String> = j.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
        lines.push(("tags", tags.join(" ")));
    }
    if !j.after.is_empty() {
        let after: Vec<String> = j
            .after
            .iter()
            .map(|a| format!("{} {}s", a.what_for(j.array_index), a.when.verb()))
            .collect();
        lines.push(("starts after", after.join(", ")));
    }
    lines.extend([(
        "state",
        output::paint_state(j.state.as_str(), j.state, colour),
    )]);
    if let Some(r) = &j.reason {
        lines.push(("reason", r.clone()));
    }
    if let Some(s) = &j.staging {
        lines.push(("staging inputs", s.summary()));
    }
    if let Some(p) = j.queue_position {
        lines.push(("queue position", p.to_string()));
    }
    if j.state == JobState::Queued {
        let at = j.estimated_start_at.flatten();
        lines.push(("estimated start", at.map_or("unknown".into(), output::when)));
    }
    lines.push(("kind", j.kind.to_string()));
    lines.push(("image", j.image.clone()));
    if !j.command.is_empty() {
        lines.push(("command", shell_words(&j.command)));
    }
    if !j.inputs.is_empty() {
        lines.push(("inputs", j.inputs.join(" ")));
    }
    if !j.datasets.is_empty() {
        let ds: Vec<String> = j
            .datasets
            .iter()
            .map(commons_api::datasets::written)
            .collect();
        lines.push(("datasets", ds.join(" ")));
    }
    lines.push(("lab", j.lab.clone()));
    lines.push(("gpus", gpu_text(j)));
    if let Some(n) = &j.node {
        lines.push(("node", n.clone()));
    }
    lines.push(("time limit", output::duration(j.time_limit_minutes * 60)));
    if let Some(s) = j.time_left_s {
        lines.push(("time left", output::duration(s)));
    }
    lines.push(("attempts", j.attempts.to_string()));
    if let Some(c) = j.exit_code {
        lines.push(("exit code", c.to_string()));
    }
    lines.push(("submitted", output::when(j.created_at)));
    if let Some(t) = j.started_at {
        lines.push(("started", output::when(t)));
    }
    if let Some(t) = j.finished_at {
        lines.push(("finished", output::when(t)));
    }
    if let Some(t) = j.last_checkpoint_at {
        lines.push(("last checkpoint", output::when(t)));
    }
    lines
}

/// A command as a shell would need it typed.
fn shell_words(words: &[String]) -> String {
    words
        .iter()
        .map(|w| {
            if !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
            {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn events(a: IdJson) -> Result<u8> {
    let client = Client::signed_in()?;
    let v: Value = client.get(&format!("/api/v1/jobs/{}/events", a.id))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(0);
    }
    let events: Vec<JobEvent> = client.parse(v)?;
    let colour = output::colour_stdout();
    let rows = events
        .into_iter()
        .map(|e| {
            vec![
                output::when(e.at).into(),
                Cell::state(e.state),
                e.message.into(),
            ]
        })
        .collect();
    print!(
        "{}",
        output::table(&["AT", "STATE", "MESSAGE"], rows, colour)
    );
    Ok(0)
}

pub fn cancel(a: CancelArgs) -> Result<u8> {
    let client = Client::signed_in()?;
    if let Some(array) = a.array {
        crate::flows::cancel_array(&client, array)?;
    }
    let mut worst: Option<CliError> = None;
    for id in a.ids {
        match client.post::<JobView>(&format!("/api/v1/jobs/{id}/cancel"), &serde_json::json!({})) {
            Ok(j) => println!("job {id} {}", j.state),
            // One that cannot be cancelled does not stop the others.
            Err(e @ (CliError::Api { .. } | CliError::Forbidden(_))) => {
                eprintln!("commons: job {id}: {e}");
                worst = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    match worst {
        Some(e) => Ok(e.exit_code()),
        None => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(state: JobState, exit_code: Option<i64>) -> JobView {
        let mut v = serde_json::json!({
            "id": 7, "state": state, "attempts": 0, "image": "x:1", "command": [],
            "gpus_requested": 1, "gpu_models": [], "time_limit_minutes": 5, "kind": "batch",
            "lab": "vision", "created_at": "2026-12-03T08:12:00.123456",
        });
        if let Some(c) = exit_code {
            v["exit_code"] = c.into();
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn show_says_the_inputs_and_how_far_they_are_staged() {
        let mut j = job(JobState::Starting, None);
        j.inputs = vec!["data/a.tar".into(), "lab:vision/code/".into()];
        j.staging = Some(commons_api::Staging {
            done_bytes: 300_000_000,
            total_bytes: 1_200_000_000,
        });
        let lines = show_lines(&j, false);
        let get = |k: &str| lines.iter().find(|(l, _)| *l == k).map(|(_, v)| v.as_str());
        assert_eq!(get("inputs"), Some("data/a.tar lab:vision/code/"));
        assert_eq!(get("staging inputs"), Some("300 MB of 1.2 GB (25 %)"));
    }

    #[test]
    fn show_gives_a_waiting_job_its_estimated_start() {
        let line = |j: &JobView| {
            show_lines(j, false)
                .into_iter()
                .find(|(k, _)| *k == "estimated start")
                .map(|(_, v)| v)
        };
        let mut j = job(JobState::Queued, None);
        j.estimated_start_at =
            Some(chrono::DateTime::from_timestamp(1_800_000_000, 0).map(|t| t.naive_utc()));
        assert_eq!(line(&j).as_deref(), Some("2027-01-15 08:00:00 UTC"));
        j.estimated_start_at = Some(None);
        assert_eq!(line(&j).as_deref(), Some("unknown"));
        j.state = JobState::Running;
        assert_eq!(line(&j), None, "only while it waits");
    }

    #[test]
    fn job_files_refuse_unknown_keys_and_name_the_key() {
        let ok = read_job_file(
            "job.toml",
            "image = \"commons-demo:latest\"\ncommand = [\"sh\", \"-c\", \"echo hi\"]\ngpus = 1\ntime_limit_minutes = 10\n",
        )
        .unwrap();
        assert_eq!(ok.gpus, 1);
        let e = read_job_file(
            "job.toml",
            "image = \"x\"\ngpus = 1\ntime_limit_minutes = 1\ngpu = 2\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("line 4") && e.contains("unknown field `gpu`"),
            "{e}"
        );
        let e = read_job_file(
            "job.toml",
            "image = \"x\"\ngpus = \"two\"\ntime_limit_minutes = 1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 2 (gpus)"), "{e}");
        let e = read_job_file("job.toml", "image = \"x\"\ngpus = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("time_limit_minutes"), "{e}");
    }

    #[test]
    fn exit_status_is_the_jobs() {
        assert_eq!(exit_status(&job(JobState::Succeeded, Some(0))), 0);
        assert_eq!(exit_status(&job(JobState::Failed, Some(3))), 3);
        assert_eq!(exit_status(&job(JobState::Failed, Some(256))), 1);
        assert_eq!(exit_status(&job(JobState::Failed, None)), 125);
        assert_eq!(exit_status(&job(JobState::Cancelled, None)), 125);
    }

    #[test]
    fn env_pairs_need_an_equals_sign() {
        assert_eq!(env_pairs(&["A=1=2".into()]).unwrap()["A"], "1=2");
        assert!(
            matches!(env_pairs(&["A".into()]), Err(CliError::Invalid { field, .. }) if field == "env")
        );
    }

    #[test]
    fn commands_are_quoted_for_a_shell() {
        let w = vec!["sh".into(), "-c".into(), "echo 'hi' there".into()];
        assert_eq!(shell_words(&w), r"sh -c 'echo '\''hi'\'' there'");
    }
}
