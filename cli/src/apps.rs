//! Web apps: `commons open ID` (a running job's app address, and a browser on it where
//! there is one) and `commons launch PRESET` (an app preset as a new job, followed until
//! its app is served).

use crate::args::{LaunchArgs, OpenArgs};
use crate::client::Client;
use crate::error::{CliError, Result};
use commons_api::app_preset::{LaunchRequest, PresetView};
use commons_api::{JobState, JobView};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `commons open ID`: the job's app address, and a browser on it where there is one.
pub fn open(a: OpenArgs) -> Result<u8> {
    let client = Client::signed_in()?;
    let job = crate::ssh::running_job(&client, a.id)?;
    let Some(url) = job.app_url else {
        return Err(CliError::Api {
            status: 409,
            code: "no_app".into(),
            message: format!(
                "job {} serves no web app (submit it with \"app\": {{\"port\": N}}), or the \
                 portal serves none ([apps] url); `commons notebook {}` forwards a port over SSH",
                a.id, a.id
            ),
        });
    };
    show(&url, a.print);
    Ok(0)
}

/// Prints an app's address, and opens a browser on it where there is one (unless
/// `print_only`).
fn show(url: &str, print_only: bool) {
    println!("{url}");
    let graphical = ["DISPLAY", "WAYLAND_DISPLAY", "BROWSER"]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
    if !print_only && graphical {
        // Best effort: the address is printed either way.
        let _ = Command::new("xdg-open")
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
    }
}

/// The preset `wanted` names among `presets`: `NAME` (a campus preset, or the only lab
/// preset of that name) or `LAB/NAME`.
pub fn find<'a>(presets: &'a [PresetView], wanted: &str) -> Result<&'a PresetView> {
    if let Some(p) = presets.iter().find(|p| p.handle() == wanted) {
        return Ok(p);
    }
    let named: Vec<&PresetView> = presets.iter().filter(|p| p.spec.name == wanted).collect();
    match named.as_slice() {
        [one] => Ok(one),
        [] => {
            let all: Vec<String> = presets.iter().map(PresetView::handle).collect();
            Err(CliError::Usage(if all.is_empty() {
                format!("no app preset {wanted:?}: you have no presets to launch")
            } else {
                format!(
                    "no app preset {wanted:?}; yours: {} (the portal's Launch page lists them)",
                    all.join(", ")
                )
            }))
        }
        many => Err(CliError::Usage(format!(
            "several labs have a preset {wanted:?}: say which, {}",
            many.iter()
                .map(|p| p.handle())
                .collect::<Vec<_>>()
                .join(" or ")
        ))),
    }
}

/// `commons launch PRESET`: launches it, prints the job's id, then (unless `--no-wait`)
/// waits for the job to run and prints its app's address.
pub fn launch(a: LaunchArgs) -> Result<u8> {
    let client = Client::signed_in()?;
    let presets: Vec<PresetView> = client.get("/api/v1/app-presets")?;
    let preset = find(&presets, &a.preset)?;
    let req = LaunchRequest {
        gpus: a.gpus,
        hours: a.hours,
        cpus: None,
        memory_gb: None,
        lab: a.lab.clone(),
    };
    // The portal's own rules, before anything is sent.
    commons_api::app_preset::job_request(&preset.spec, preset.lab.as_deref(), &req)?;
    let job: JobView = client.post(&format!("/api/v1/app-presets/{}/launch", preset.id), &req)?;
    eprintln!(
        "job {} launched ({}); `commons cancel {}` ends it",
        job.id, preset.spec.title, job.id
    );
    println!("{}", job.id);
    if a.no_wait {
        return Ok(0);
    }
    let url = wait_for_app(&client, job.id)?;
    show(&url, a.print);
    Ok(0)
}

/// Polls the job until its app is served (its address), saying on stderr why it waits;
/// an error when the job ends first.
fn wait_for_app(client: &Client, id: i64) -> Result<String> {
    let mut said = String::new();
    loop {
        let job: JobView = client.get(&format!("/api/v1/jobs/{id}"))?;
        if let Some(url) = job.app_url {
            return Ok(url);
        }
        if matches!(
            job.state,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        ) {
            return Err(CliError::Api {
                status: 409,
                code: "ended".into(),
                message: format!(
                    "job {id} has ended ({}{}) before its app was served: `commons logs {id}` \
                     shows its output",
                    job.state,
                    job.reason.map(|r| format!(": {r}")).unwrap_or_default()
                ),
            });
        }
        let now = match &job.reason {
            Some(r) => format!("{}: {r}", job.state),
            None => job.state.to_string(),
        };
        if now != said {
            eprintln!("job {id} is {now}");
            said = now;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preset(id: i64, lab: Option<&str>, name: &str) -> PresetView {
        serde_json::from_value(serde_json::json!({
            "id": id, "lab": lab, "name": name, "title": name, "description": "",
            "colour": "#3b6ea5", "image": "jupyter:4", "command": [], "port": 8888,
            "gpus": 1, "max_gpus": 1, "hours": 1, "max_hours": 1, "cpus": 4.0,
            "max_cpus": 4.0, "memory_gb": 16.0, "max_memory_gb": 16.0, "user_sets": [],
            "idle_minutes": 60, "updated_by": "olga", "updated_at": "2026-12-11T08:00:00"
        }))
        .unwrap()
    }

    #[test]
    fn presets_are_found_by_name_or_lab_and_name() {
        let all = vec![
            preset(1, None, "jupyter"),
            preset(2, Some("vision"), "jupyter"),
            preset(3, Some("vision"), "tensorboard"),
            preset(4, Some("nlp"), "tensorboard"),
            preset(5, Some("nlp"), "rstudio"),
        ];
        assert_eq!(find(&all, "jupyter").unwrap().id, 1, "the campus's first");
        assert_eq!(find(&all, "vision/jupyter").unwrap().id, 2);
        assert_eq!(find(&all, "rstudio").unwrap().id, 5, "the only one");
        let e = find(&all, "tensorboard").unwrap_err().to_string();
        assert!(e.contains("vision/tensorboard or nlp/tensorboard"), "{e}");
        let e = find(&all, "vscode").unwrap_err().to_string();
        assert!(e.contains("jupyter, vision/jupyter"), "{e}");
    }
}
