//! App presets: a web app (JupyterLab, TensorBoard, ...) that operators (campus-wide)
//! or a lab's admins (for their lab) describe once, and that users launch from a short
//! form (`/launch`, `commons launch PRESET`): the image, a command template, the app's
//! port, default and largest resources, which of them a user may change, and how long
//! the app may sit idle.
//!
//! Invariants: a stored preset has passed [`check`], so every launch within its bounds
//! makes a job request that passes [`crate::job::check`]; [`job_request`] refuses a
//! change the preset does not offer, or a value past its bound, naming the field.

use crate::job::{
    self, JobKind, JobRequest, DEFAULT_CPUS, DEFAULT_MEMORY_GB, MAX_CPUS, MAX_GPUS, MAX_MEMORY_GB,
    MIN_CPUS, MIN_MEMORY_GB,
};
use crate::rules::{image_reference, slug};
use crate::web_app::{AppSpec, APP_PORTS, IDLE_MINUTES};
use crate::Invalid;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The longest session a preset may offer, in hours (the job's 30 days).
pub const MAX_HOURS: i64 = job::MAX_TIME_LIMIT_MIN / 60;
/// The longest title, in characters.
pub const MAX_TITLE: usize = 64;
/// The longest description, in characters.
pub const MAX_DESCRIPTION: usize = 300;
/// A preset's colour when none is given.
pub const DEFAULT_COLOUR: &str = "#3b6ea5";
/// An idle limit when none is given, in minutes.
pub const DEFAULT_IDLE_MINUTES: i64 = 60;
/// What `{base_url}` becomes: an app is served at the root of an origin of its own.
pub const BASE_URL: &str = "/";

/// A setting that a preset may let its users change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Choice {
    Gpus,
    Hours,
    Cpus,
    MemoryGb,
}

impl Choice {
    pub const ALL: [Choice; 4] = [Choice::Gpus, Choice::Hours, Choice::Cpus, Choice::MemoryGb];

    pub fn as_str(self) -> &'static str {
        match self {
            Choice::Gpus => "gpus",
            Choice::Hours => "hours",
            Choice::Cpus => "cpus",
            Choice::MemoryGb => "memory_gb",
        }
    }

    /// The setting named `s` (`gpus`, `hours`, `cpus`, `memory_gb`).
    pub fn parse(s: &str) -> Option<Choice> {
        Choice::ALL.into_iter().find(|c| c.as_str() == s.trim())
    }
}

impl std::fmt::Display for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `POST /api/v1/app-presets` and `PUT /api/v1/app-presets/{id}`: a preset as its
/// author writes it. Left out: `max_*` is the default (nothing to choose), CPUs and
/// memory the job defaults (4 and 16 GB), the colour [`DEFAULT_COLOUR`], the idle limit
/// 60 minutes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PresetRequest {
    /// A short name to launch it by (`commons launch jupyter`): lower-case letters,
    /// digits and '-', unique among the campus's presets or its lab's.
    pub name: String,
    /// What the launch page calls it ("JupyterLab").
    pub title: String,
    /// One line under the title.
    #[serde(default)]
    pub description: String,
    /// Its colour on the launch page, `#rrggbb`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub colour: Option<String>,
    /// The image, from the allow-list (the campus's for a campus preset, the lab's or
    /// the campus's for a lab's).
    pub image: String,
    /// The command template: `{port}` becomes the app's port and `{base_url}` its path
    /// prefix (`/`: each app has an origin of its own). Empty: the image's own command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The port the app listens on, on the container's localhost (1024 to 65535).
    pub port: i64,
    /// GPUs by default (1 to 16) and at most.
    pub gpus: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gpus: Option<i64>,
    /// The session's length in hours by default (1 to 720) and at most.
    pub hours: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_hours: Option<i64>,
    /// CPUs by default and at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cpus: Option<f64>,
    /// Memory in GB by default and at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gb: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory_gb: Option<f64>,
    /// Which of these the launch form lets a user change (up to their maximum).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_sets: Vec<Choice>,
    /// Minutes without a request, an open WebSocket or an SSH session after which the
    /// app ends (with a warning first), 1 to 10080.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_minutes: Option<i64>,
    /// The lab it is for (its admins write it, its members launch it); left out: the
    /// whole campus (operators only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lab: Option<String>,
}

/// A preset as checked and stored: every bound concrete.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PresetSpec {
    pub name: String,
    pub title: String,
    pub description: String,
    pub colour: String,
    pub image: String,
    pub command: Vec<String>,
    pub port: i64,
    pub gpus: i64,
    pub max_gpus: i64,
    pub hours: i64,
    pub max_hours: i64,
    pub cpus: f64,
    pub max_cpus: f64,
    pub memory_gb: f64,
    pub max_memory_gb: f64,
    pub user_sets: Vec<Choice>,
    pub idle_minutes: i64,
}

/// A preset as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PresetView {
    pub id: i64,
    /// The lab it is for; absent: the whole campus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lab: Option<String>,
    #[serde(flatten)]
    pub spec: PresetSpec,
    /// Who wrote it last.
    pub updated_by: String,
    pub updated_at: chrono::NaiveDateTime,
}

impl PresetView {
    /// How users name it: `NAME` for a campus preset, `LAB/NAME` for a lab's.
    pub fn handle(&self) -> String {
        match &self.lab {
            Some(l) => format!("{l}/{}", self.spec.name),
            None => self.spec.name.clone(),
        }
    }

    /// Whether users may change `c`.
    pub fn offers(&self, c: Choice) -> bool {
        self.spec.user_sets.contains(&c)
    }
}

/// `POST /api/v1/app-presets/{id}/launch`: what a user chose; left out: the preset's
/// defaults. A value equal to the default is accepted even where it cannot be changed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LaunchRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hours: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gb: Option<f64>,
    /// The lab to charge, for a campus preset when the user is in several labs (a lab's
    /// preset is always charged to its lab).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lab: Option<String>,
}

/// `template` with `{port}` and `{base_url}` filled in.
pub fn fill(template: &str, port: i64, base_url: &str) -> String {
    template
        .replace("{port}", &port.to_string())
        .replace("{base_url}", base_url)
}

fn one_line(field: &str, s: &str, max: usize, required: bool) -> Result<String, Invalid> {
    let s = s.trim();
    if required && s.is_empty() {
        return Err(Invalid::new(field, format!("give the preset a {field}")));
    }
    if s.chars().count() > max || s.chars().any(char::is_control) {
        return Err(Invalid::new(
            field,
            format!("use at most {max} characters on one line"),
        ));
    }
    Ok(s.to_string())
}

fn colour(c: Option<&str>) -> Result<String, Invalid> {
    let c = c.map(str::trim).filter(|c| !c.is_empty());
    let Some(c) = c else {
        return Ok(DEFAULT_COLOUR.to_string());
    };
    let hex = c.strip_prefix('#').unwrap_or("");
    if hex.len() != 6 || !hex.chars().all(|h| h.is_ascii_hexdigit()) {
        return Err(Invalid::new(
            "colour",
            format!("{c:?} is not a colour: write #rrggbb, e.g. {DEFAULT_COLOUR}"),
        ));
    }
    Ok(format!("#{}", hex.to_ascii_lowercase()))
}

/// A default and its largest value, both within `lo..=hi`, the default at most the
/// largest; the error names `field` or `max_field`.
fn bounded<T: PartialOrd + Copy + std::fmt::Display>(
    (field, max_field): (&str, &str),
    default: T,
    max: Option<T>,
    (lo, hi): (T, T),
) -> Result<(T, T), Invalid> {
    if !(default >= lo && default <= hi) {
        return Err(Invalid::new(
            field,
            format!("{field} must be {lo} to {hi}, not {default}"),
        ));
    }
    let max = max.unwrap_or(default);
    if !(max >= default && max <= hi) {
        return Err(Invalid::new(
            max_field,
            format!("{max_field} must be from {field} ({default}) to {hi}, not {max}"),
        ));
    }
    Ok((default, max))
}

/// The app's port and idle limit (the limit, with its default).
fn port_and_idle(req: &PresetRequest) -> Result<i64, Invalid> {
    if !APP_PORTS.contains(&req.port) {
        return Err(Invalid::new(
            "port",
            format!(
                "the app's port is {}; use {} to {} (on the container's localhost)",
                req.port,
                APP_PORTS.start(),
                APP_PORTS.end()
            ),
        ));
    }
    let idle_minutes = req.idle_minutes.unwrap_or(DEFAULT_IDLE_MINUTES);
    if !IDLE_MINUTES.contains(&idle_minutes) {
        return Err(Invalid::new(
            "idle_minutes",
            format!(
                "the idle limit must be {} to {} minutes, not {idle_minutes}",
                IDLE_MINUTES.start(),
                IDLE_MINUTES.end()
            ),
        ));
    }
    Ok(idle_minutes)
}

/// Checks a preset and makes its stored form. Besides its own rules, the job it makes
/// at its defaults and at its maxima must pass the job rules.
pub fn check(req: &PresetRequest) -> Result<PresetSpec, Invalid> {
    let name = req.name.trim();
    slug("name", name)?;
    let idle_minutes = port_and_idle(req)?;
    let (gpus, max_gpus) = bounded(("gpus", "max_gpus"), req.gpus, req.max_gpus, (1, MAX_GPUS))?;
    let (hours, max_hours) = bounded(
        ("hours", "max_hours"),
        req.hours,
        req.max_hours,
        (1, MAX_HOURS),
    )?;
    let (cpus, max_cpus) = bounded(
        ("cpus", "max_cpus"),
        req.cpus.unwrap_or(DEFAULT_CPUS),
        req.max_cpus,
        (MIN_CPUS, MAX_CPUS),
    )?;
    let (memory_gb, max_memory_gb) = bounded(
        ("memory_gb", "max_memory_gb"),
        req.memory_gb.unwrap_or(DEFAULT_MEMORY_GB),
        req.max_memory_gb,
        (MIN_MEMORY_GB, MAX_MEMORY_GB),
    )?;
    let mut user_sets = req.user_sets.clone();
    user_sets.sort();
    user_sets.dedup();
    let spec = PresetSpec {
        name: name.to_string(),
        title: one_line("title", &req.title, MAX_TITLE, true)?,
        description: one_line("description", &req.description, MAX_DESCRIPTION, false)?,
        colour: colour(req.colour.as_deref())?,
        image: req.image.trim().to_string(),
        command: req.command.clone(),
        port: req.port,
        gpus,
        max_gpus,
        hours,
        max_hours,
        cpus,
        max_cpus,
        memory_gb,
        max_memory_gb,
        user_sets,
        idle_minutes,
    };
    image_reference(&spec.image)?;
    check_jobs(&spec, req.lab.as_deref())?;
    Ok(spec)
}

/// The jobs a preset can make pass the job rules: at its defaults, and with everything
/// at its largest.
fn check_jobs(spec: &PresetSpec, lab: Option<&str>) -> Result<(), Invalid> {
    job::check(&job_request(spec, lab, &LaunchRequest::default())?)?;
    let most = LaunchRequest {
        gpus: Some(spec.max_gpus),
        hours: Some(spec.max_hours),
        cpus: Some(spec.max_cpus),
        memory_gb: Some(spec.max_memory_gb),
        lab: None,
    };
    let all = PresetSpec {
        user_sets: Choice::ALL.to_vec(),
        ..spec.clone()
    };
    job::check(&job_request(&all, lab, &most)?)
}

/// A user's choice of one setting: the default when left out (or equal to it), else
/// one the preset offers, within `lo..=max`.
fn chosen<T: PartialOrd + Copy + std::fmt::Display>(
    spec: &PresetSpec,
    c: Choice,
    asked: Option<T>,
    (default, lo, max): (T, T, T),
    unit: &str,
) -> Result<T, Invalid> {
    let Some(v) = asked.filter(|v| *v != default) else {
        return Ok(default);
    };
    if !spec.user_sets.contains(&c) {
        return Err(Invalid::new(
            c.as_str(),
            format!(
                "{} runs with {default} {unit}; its {c} cannot be changed",
                spec.name
            ),
        ));
    }
    if !(v >= lo && v <= max) {
        return Err(Invalid::new(
            c.as_str(),
            format!("{} offers {lo} to {max} {unit}, not {v}", spec.name),
        ));
    }
    Ok(v)
}

/// The job a launch makes: interactive, the preset's image and filled-in command, the
/// chosen resources, its app (port and idle limit), named and tagged after the preset.
/// `lab`: the preset's lab, if it is a lab's.
pub fn job_request(
    spec: &PresetSpec,
    lab: Option<&str>,
    launch: &LaunchRequest,
) -> Result<JobRequest, Invalid> {
    let gpus = chosen(
        spec,
        Choice::Gpus,
        launch.gpus,
        (spec.gpus, 1, spec.max_gpus),
        "GPUs",
    )?;
    let hours = chosen(
        spec,
        Choice::Hours,
        launch.hours,
        (spec.hours, 1, spec.max_hours),
        "hours",
    )?;
    let cpus = chosen(
        spec,
        Choice::Cpus,
        launch.cpus,
        (spec.cpus, MIN_CPUS, spec.max_cpus),
        "CPUs",
    )?;
    let memory_gb = chosen(
        spec,
        Choice::MemoryGb,
        launch.memory_gb,
        (spec.memory_gb, MIN_MEMORY_GB, spec.max_memory_gb),
        "GB of memory",
    )?;
    let lab = match (lab, launch.lab.as_deref()) {
        (Some(own), Some(asked)) if own != asked => {
            return Err(Invalid::new(
                "lab",
                format!(
                    "{} is lab {own}'s preset: its jobs are charged to {own}",
                    spec.name
                ),
            ));
        }
        (Some(own), _) => Some(own.to_string()),
        (None, asked) => asked.map(str::to_string),
    };
    let mut req = JobRequest::new(&spec.image, gpus, hours * 60);
    req.command = spec
        .command
        .iter()
        .map(|a| fill(a, spec.port, BASE_URL))
        .collect();
    req.cpus = Some(cpus);
    req.memory_gb = Some(memory_gb);
    req.kind = JobKind::Interactive;
    req.lab = lab;
    req.name = Some(spec.title.clone());
    req.tags = BTreeMap::from([("preset".to_string(), spec.name.clone())]);
    req.app = Some(AppSpec {
        port: spec.port,
        idle_minutes: Some(spec.idle_minutes),
    });
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jupyter() -> PresetRequest {
        serde_json::from_value(serde_json::json!({
            "name": "jupyter", "title": "JupyterLab", "image": "jupyter:4",
            "command": ["sh", "-c", "jupyter lab --ip=127.0.0.1 --port={port} --ServerApp.base_url={base_url} --IdentityProvider.token=''"],
            "port": 8888, "gpus": 1, "max_gpus": 4, "hours": 4, "max_hours": 12,
            "user_sets": ["hours", "gpus", "gpus"], "idle_minutes": 30
        }))
        .unwrap()
    }

    #[test]
    fn a_preset_is_stored_with_every_bound_concrete() {
        let spec = check(&jupyter()).unwrap();
        assert_eq!(spec.user_sets, vec![Choice::Gpus, Choice::Hours]);
        assert_eq!((spec.cpus, spec.max_cpus), (DEFAULT_CPUS, DEFAULT_CPUS));
        assert_eq!(spec.colour, DEFAULT_COLOUR);
        assert_eq!((spec.max_gpus, spec.max_hours), (4, 12));
    }

    #[test]
    fn bad_presets_are_refused_naming_the_field() {
        let cases: Vec<(&str, serde_json::Value)> = vec![
            ("name", serde_json::json!({"name": "Jupyter Lab"})),
            ("title", serde_json::json!({"title": " "})),
            ("colour", serde_json::json!({"colour": "red"})),
            ("image", serde_json::json!({"image": "UPPER CASE"})),
            ("port", serde_json::json!({"port": 80})),
            ("gpus", serde_json::json!({"gpus": 0})),
            ("max_gpus", serde_json::json!({"max_gpus": 17})),
            ("max_hours", serde_json::json!({"max_hours": 2})),
            ("max_cpus", serde_json::json!({"cpus": 8, "max_cpus": 2})),
            ("idle_minutes", serde_json::json!({"idle_minutes": 0})),
            ("idle_minutes", serde_json::json!({"idle_minutes": 10081})),
            ("command", serde_json::json!({"command": ["a\u{0}b"]})),
        ];
        for (field, change) in cases {
            let mut v = serde_json::to_value(jupyter()).unwrap();
            for (k, x) in change.as_object().unwrap() {
                v[k] = x.clone();
            }
            let req: PresetRequest = serde_json::from_value(v).unwrap();
            let e = check(&req).unwrap_err();
            assert_eq!(e.field, field, "{change}: {e}");
        }
    }

    #[test]
    fn a_launch_fills_the_template_and_stays_within_the_bounds() {
        let spec = check(&jupyter()).unwrap();
        let req = job_request(
            &spec,
            None,
            &LaunchRequest {
                gpus: Some(2),
                hours: Some(8),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            req.command[2],
            "jupyter lab --ip=127.0.0.1 --port=8888 --ServerApp.base_url=/ --IdentityProvider.token=''"
        );
        assert_eq!((req.gpus, req.time_limit_minutes), (2, 480));
        assert_eq!(req.kind, JobKind::Interactive);
        assert_eq!(req.app.unwrap().idle_minutes, Some(30));
        assert_eq!(req.tags["preset"], "jupyter");
        assert_eq!(job::check(&req), Ok(()));
        let too_many = LaunchRequest {
            gpus: Some(5),
            ..Default::default()
        };
        let e = job_request(&spec, None, &too_many).unwrap_err();
        assert_eq!(e.field, "gpus", "{e}");
        let fixed = LaunchRequest {
            cpus: Some(8.0),
            ..Default::default()
        };
        let e = job_request(&spec, None, &fixed).unwrap_err();
        assert_eq!(e.field, "cpus", "{e}");
        let same = LaunchRequest {
            cpus: Some(DEFAULT_CPUS),
            ..Default::default()
        };
        assert!(
            job_request(&spec, None, &same).is_ok(),
            "the default itself"
        );
        let other_lab = LaunchRequest {
            lab: Some("nlp".into()),
            ..Default::default()
        };
        let e = job_request(&spec, Some("vision"), &other_lab).unwrap_err();
        assert_eq!(e.field, "lab");
        let r = job_request(&spec, Some("vision"), &LaunchRequest::default()).unwrap();
        assert_eq!(r.lab.as_deref(), Some("vision"));
    }

    #[test]
    fn choices_read_as_they_are_written() {
        for c in Choice::ALL {
            assert_eq!(Choice::parse(c.as_str()), Some(c));
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        }
        assert_eq!(Choice::parse("disk"), None);
    }
}
