//! The job request: the body of `POST /api/v1/jobs` and the contents of a `commons
//! submit` job file (the same fields; unknown ones are refused), and [`check`], every
//! rule on it that needs no database.

use crate::rules::{image_reference, slug};
use crate::Invalid;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const MAX_GPUS: i64 = 16;
pub const MAX_TIME_LIMIT_MIN: i64 = 30 * 24 * 60;
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
pub const MAX_ENV_BYTES: usize = 64 * 1024;
pub const MAX_CPUS: f64 = 512.0;
pub const MAX_MEMORY_GB: f64 = 4096.0;
pub const MIN_MEMORY_GB: f64 = 0.0625;
pub const MAX_GPU_MEMORY_GB: f64 = 1024.0;
pub const DEFAULT_CPUS: f64 = 4.0;
pub const DEFAULT_MEMORY_GB: f64 = 16.0;
/// The largest disk a job may ask for, in GiB (each node has its own, smaller, limit).
pub const MAX_DISK_GB: i64 = 65_536;
/// The most often a job may ask for periodic checkpoints, and the least.
pub const CHECKPOINT_MINUTES: std::ops::RangeInclusive<i64> = 1..=1440;

/// A batch job runs its command; an interactive one waits for its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    #[default]
    Batch,
    Interactive,
}

impl JobKind {
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Batch => "batch",
            JobKind::Interactive => "interactive",
        }
    }
}

impl std::fmt::Display for JobKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job as submitted, through the API, the form or a job file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct JobRequest {
    /// The container image, `[host[:port]/]path[:tag][@sha256:...]`, from the allow-list.
    pub image: String,
    /// The command and its arguments (no shell unless you ask for one: `["sh", "-c", ".."]`);
    /// empty: the image's own command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Environment variables; `COMMONS_*` is reserved.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// GPUs, 1 to 16, all on one server.
    pub gpus: i64,
    /// Acceptable GPU models (any when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_models: Vec<String>,
    /// Least memory per GPU, in GB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_gpu_memory_gb: Option<f64>,
    /// A share of one GPU's compute instead of the whole GPU (with `gpus: 1`): 0.05 to 1.0
    /// in steps of 0.05. Shares run only on servers whose lab lends shares; 1.0 without
    /// `gpu_memory_gb` is the whole GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_fraction: Option<f64>,
    /// The GPU memory of a share of one GPU, in GB (with `gpus: 1`); with no
    /// `gpu_fraction`, the compute share is as much as this is of the GPU's memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_gb: Option<f64>,
    /// CPUs (default 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Memory in GB (default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gb: Option<f64>,
    /// The time limit, 1 to 43200 minutes (30 days).
    pub time_limit_minutes: i64,
    /// `batch` (the default) or `interactive`.
    #[serde(default)]
    pub kind: JobKind,
    /// Slug of the lab to charge; may be left out when the user is in one lab.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lab: Option<String>,
    /// Snapshot `/checkpoint` every this many minutes while the job runs (besides the
    /// upload when it is stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_minutes: Option<i64>,
    /// The size of `/dev/shm` in MiB (PyTorch's data loaders use it), at most the job's
    /// memory; none: 64 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_mb: Option<i64>,
    /// The job's disk in GiB: every host path it writes (`/checkpoint`) holds at most
    /// this much, and so does its checkpoint (files at their apparent size). None: the
    /// campus default. A job is placed only on servers that give a job this much.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_gb: Option<i64>,
    /// Which events of this job to notify about, instead of the owner's settings:
    /// `started`, `preempted`, `succeeded`, `failed`, `cancelled`, or `start`, `end`,
    /// `fail`, `all` (`["end", "fail"]`). Left out: the owner's settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<Vec<String>>,
    /// Makes an array of tasks, one job each: `0-99`, `1,3,5-9`, `0-98:2`, with `%8` the
    /// most that run at once. Each task sees `COMMONS_ARRAY_ID`, `COMMONS_ARRAY_INDEX`
    /// and `COMMONS_ARRAY_COUNT`, and `{index}` in its command and environment values is
    /// replaced by its index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<String>,
    /// A name for people to find it by (at most 128 characters; need not be unique).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Labels, `{"key": "value"}`, at most 16 (`?tag=key=value` finds them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// Jobs this one waits for: `[{"job": 41, "when": "ok|fail|any"}]`. A wait that can no
    /// longer be met ends this job as failed, with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<crate::flows::After>,
    /// A web app the job serves, `{"port": 8888}`: the portal relays to it on an origin
    /// of its own (`app_url` in the job's view, the **Open** button).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<crate::web_app::AppSpec>,
    /// Files and folders staged read-only under `/inputs` before the job starts: `PATH`
    /// in the owner's file space, `lab:SLUG/PATH` in a lab's (under `/inputs/lab/SLUG/`);
    /// a trailing `/` names a folder. At most 64; each must exist when the job is
    /// submitted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// Lab datasets mounted read-only: `[{"lab": "vision", "name": "imagenet", "mount":
    /// "/datasets/imagenet"}]` (`mount` defaults to `/datasets/NAME`). At most 16; each
    /// must be registered and visible to the owner when the job is submitted and when it
    /// starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datasets: Vec<crate::datasets::JobDataset>,
}

/// The least CPU share the Docker Engine accepts.
pub const MIN_CPUS: f64 = 0.01;

impl JobRequest {
    /// A batch request with the required fields, the rest left to their defaults.
    pub fn new(image: &str, gpus: i64, time_limit_minutes: i64) -> JobRequest {
        JobRequest {
            image: image.to_string(),
            command: Vec::new(),
            env: BTreeMap::new(),
            gpus,
            gpu_models: Vec::new(),
            min_gpu_memory_gb: None,
            gpu_fraction: None,
            gpu_memory_gb: None,
            cpus: None,
            memory_gb: None,
            time_limit_minutes,
            kind: JobKind::Batch,
            lab: None,
            checkpoint_minutes: None,
            shm_mb: None,
            disk_gb: None,
            notify: None,
            array: None,
            name: None,
            tags: BTreeMap::new(),
            after: Vec::new(),
            app: None,
            inputs: Vec::new(),
            datasets: Vec::new(),
        }
    }
}

/// Checks every rule that needs no database; the first broken one names its field.
/// (The portal then checks that the user belongs to the lab.)
pub fn check(req: &JobRequest) -> Result<(), Invalid> {
    image_reference(req.image.trim())?;
    command(&req.command)?;
    env(&req.env)?;
    gpus(req)?;
    resources(req)?;
    if let Some(lab) = &req.lab {
        slug("lab", lab)?;
    }
    if let Some(n) = &req.notify {
        crate::notify::events("notify", n)?;
    }
    crate::array::check(req)?;
    if let Some(n) = &req.name {
        crate::flows::name("name", n)?;
    }
    crate::flows::tags(&req.tags)?;
    crate::flows::after(&req.after, req.array.is_some())?;
    if let Some(app) = &req.app {
        crate::web_app::check(app)?;
    }
    crate::files::check_inputs(&req.inputs)?;
    crate::datasets::check_job_datasets(&req.datasets)?;
    Ok(())
}

/// At most 64 KiB of arguments, none with a NUL byte.
fn command(command: &[String]) -> Result<(), Invalid> {
    let command_bytes: usize = command.iter().map(|a| a.len() + 1).sum();
    if command_bytes > MAX_COMMAND_BYTES {
        return Err(Invalid::new(
            "command",
            format!(
                "the command is {command_bytes} bytes; at most {MAX_COMMAND_BYTES} are allowed"
            ),
        ));
    }
    if command.iter().any(|a| a.contains('\0')) {
        return Err(Invalid::new("command", "the command contains a NUL byte"));
    }
    Ok(())
}

/// How many GPUs, of which models, with how much memory each.
fn gpus(req: &JobRequest) -> Result<(), Invalid> {
    if !(1..=MAX_GPUS).contains(&req.gpus) {
        return Err(Invalid::new(
            "gpus",
            format!(
                "ask for 1 to {MAX_GPUS} GPUs (all on one server), not {}",
                req.gpus
            ),
        ));
    }
    if req.gpu_models.len() > 16
        || req
            .gpu_models
            .iter()
            .any(|m| m.trim().is_empty() || m.len() > 64)
    {
        return Err(Invalid::new(
            "gpu_models",
            "list at most 16 GPU model names, each 1 to 64 characters",
        ));
    }
    let min_mem = req.min_gpu_memory_gb.unwrap_or(0.0);
    if !(0.0..=MAX_GPU_MEMORY_GB).contains(&min_mem) {
        return Err(Invalid::new(
            "min_gpu_memory_gb",
            format!("must be between 0 and {MAX_GPU_MEMORY_GB}"),
        ));
    }
    gpu_share(req).map(|_| ())
}

/// The share of one GPU the request asks for: `(milli, memory_mb)` (either may be 0: see
/// [`JobRequest::gpu_memory_gb`]), or `None` for whole GPUs.
pub fn gpu_share(req: &JobRequest) -> Result<Option<(u32, u64)>, Invalid> {
    use commons_sched::share::{GpuAsk, ShareError};
    if req.gpu_fraction.is_none() && req.gpu_memory_gb.is_none() {
        return Ok(None);
    }
    if let Some(gb) = req.gpu_memory_gb.filter(|g| *g > MAX_GPU_MEMORY_GB) {
        return Err(Invalid::new(
            "gpu_memory_gb",
            format!("gpu_memory_gb must be at most {MAX_GPU_MEMORY_GB} GB, not {gb}"),
        ));
    }
    let ask = GpuAsk::from_fields(req.gpu_fraction, req.gpu_memory_gb).map_err(|e| {
        let field = match e {
            ShareError::Memory(_) => "gpu_memory_gb",
            _ => "gpu_fraction",
        };
        Invalid::new(field, e.to_string())
    })?;
    let share = match ask {
        GpuAsk::Share { milli, memory_mb } => Some((milli, memory_mb)),
        _ => None,
    };
    if share.is_some() && req.gpus != 1 {
        return Err(Invalid::new(
            "gpus",
            format!(
                "a share of a GPU (gpu_fraction, gpu_memory_gb) is a share of one GPU: ask \
                 for gpus: 1, not {}",
                req.gpus
            ),
        ));
    }
    Ok(share)
}

/// CPUs, memory, time limit, checkpoint interval, /dev/shm and disk.
fn resources(req: &JobRequest) -> Result<(), Invalid> {
    let cpus = req.cpus.unwrap_or(DEFAULT_CPUS);
    if !(MIN_CPUS..=MAX_CPUS).contains(&cpus) {
        return Err(Invalid::new(
            "cpus",
            format!(
                "must be at least {MIN_CPUS} (the container engine's least) and at most {MAX_CPUS}"
            ),
        ));
    }
    let mem = req.memory_gb.unwrap_or(DEFAULT_MEMORY_GB);
    if !(MIN_MEMORY_GB..=MAX_MEMORY_GB).contains(&mem) {
        return Err(Invalid::new(
            "memory_gb",
            format!("must be between {MIN_MEMORY_GB} and {MAX_MEMORY_GB}"),
        ));
    }
    if !(1..=MAX_TIME_LIMIT_MIN).contains(&req.time_limit_minutes) {
        return Err(Invalid::new(
            "time_limit_minutes",
            format!("must be 1 to {MAX_TIME_LIMIT_MIN} minutes (30 days)"),
        ));
    }
    if let Some(m) = req.checkpoint_minutes {
        if !CHECKPOINT_MINUTES.contains(&m) {
            return Err(Invalid::new(
                "checkpoint_minutes",
                format!(
                    "must be {} to {} minutes between checkpoints",
                    CHECKPOINT_MINUTES.start(),
                    CHECKPOINT_MINUTES.end()
                ),
            ));
        }
    }
    if let Some(shm) = req.shm_mb {
        let memory_mb = (mem * 1024.0).round() as i64;
        if !(1..=memory_mb).contains(&shm) {
            return Err(Invalid::new(
                "shm_mb",
                format!("/dev/shm must be 1 to {memory_mb} MiB (the job's memory)"),
            ));
        }
    }
    if let Some(gb) = req.disk_gb {
        if !(1..=MAX_DISK_GB).contains(&gb) {
            return Err(Invalid::new(
                "disk_gb",
                format!("the job's disk must be 1 to {MAX_DISK_GB} GiB, not {gb}"),
            ));
        }
    }
    Ok(())
}

/// The environment: identifiers for names, `COMMONS_*` reserved, 64 KiB in all.
fn env(env: &BTreeMap<String, String>) -> Result<(), Invalid> {
    let env_bytes: usize = env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    if env_bytes > MAX_ENV_BYTES {
        return Err(Invalid::new(
            "env",
            format!("the environment is {env_bytes} bytes; at most {MAX_ENV_BYTES} are allowed"),
        ));
    }
    for k in env.keys() {
        let ok = !k.is_empty()
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !k.starts_with(|c: char| c.is_ascii_digit());
        if !ok {
            return Err(Invalid::new(
                "env",
                format!("{k:?} is not a valid variable name"),
            ));
        }
        if k.starts_with("COMMONS_") {
            return Err(Invalid::new(
                "env",
                format!("{k} is reserved: COMMONS_ variables are set by GPU Commons"),
            ));
        }
        if k.starts_with("NVIDIA_") || k.starts_with("CUDA_MPS_") || k == "CUDA_VISIBLE_DEVICES" {
            return Err(Invalid::new(
                "env",
                format!("{k} is set by GPU Commons from the GPUs the job gets; leave it out"),
            ));
        }
    }
    if let Some((k, _)) = env
        .iter()
        .find(|(k, v)| k.contains('\0') || v.contains('\0'))
    {
        return Err(Invalid::new("env", format!("{k:?} holds a NUL byte")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> JobRequest {
        serde_json::from_str(r#"{"image":"commons-demo:latest","command":["sh","-c","echo hi"],"gpus":1,"time_limit_minutes":10}"#).unwrap()
    }
    fn field_of(r: JobRequest) -> String {
        check(&r).unwrap_err().field
    }

    #[test]
    fn a_good_request_passes_and_round_trips() {
        let r = req();
        assert_eq!(check(&r), Ok(()));
        assert_eq!(r.kind, JobKind::Batch);
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<JobRequest>(&json).unwrap(), r);
        assert!(!json.contains("null"), "{json}");
    }

    #[test]
    fn each_bad_field_is_named() {
        let mut r = req();
        r.image = "Not An Image".into();
        assert_eq!(field_of(r), "image");
        for g in [0, -1, 1000] {
            let mut r = req();
            r.gpus = g;
            assert_eq!(field_of(r), "gpus");
        }
        let mut r = req();
        r.time_limit_minutes = 0;
        assert_eq!(field_of(r), "time_limit_minutes");
        let mut r = req();
        r.checkpoint_minutes = Some(0);
        assert_eq!(field_of(r), "checkpoint_minutes");
        let mut r = req();
        r.command = vec!["x".repeat(MAX_COMMAND_BYTES + 1)];
        assert_eq!(field_of(r), "command");
        let mut r = req();
        r.env.insert("COMMONS_JOB_ID".into(), "1".into());
        assert_eq!(field_of(r), "env");
        let mut r = req();
        r.env.insert("1X".into(), "1".into());
        assert_eq!(field_of(r), "env");
        let mut r = req();
        r.cpus = Some(f64::NAN);
        assert_eq!(field_of(r), "cpus");
        let mut r = req();
        r.memory_gb = Some(0.0);
        assert_eq!(field_of(r), "memory_gb");
        let mut r = req();
        r.min_gpu_memory_gb = Some(-1.0);
        assert_eq!(field_of(r), "min_gpu_memory_gb");
        for (fraction, memory, gpus, field) in [
            (Some(0.0), None, 1, "gpu_fraction"),
            (Some(0.33), None, 1, "gpu_fraction"),
            (Some(1.5), None, 1, "gpu_fraction"),
            (None, Some(0.0), 1, "gpu_memory_gb"),
            (None, Some(2000.0), 1, "gpu_memory_gb"),
            (Some(0.5), None, 2, "gpus"),
        ] {
            let mut r = req();
            (r.gpu_fraction, r.gpu_memory_gb, r.gpus) = (fraction, memory, gpus);
            assert_eq!(field_of(r), field, "{fraction:?} {memory:?} {gpus}");
        }
        let mut r = req();
        (r.gpu_fraction, r.gpu_memory_gb) = (Some(0.25), Some(10.0));
        assert_eq!(gpu_share(&r).unwrap(), Some((250, 10240)));
        r.gpu_memory_gb = None;
        assert_eq!(gpu_share(&r).unwrap(), Some((250, 0)));
        // The whole GPU, said as a fraction: no share.
        r.gpu_fraction = Some(1.0);
        assert_eq!(gpu_share(&r).unwrap(), None);
        let mut r = req();
        r.gpu_models = vec![" ".into()];
        assert_eq!(field_of(r), "gpu_models");
        let mut r = req();
        r.lab = Some("Vision Lab".into());
        assert_eq!(field_of(r), "lab");
        for gb in [0, -5, MAX_DISK_GB + 1] {
            let mut r = req();
            r.disk_gb = Some(gb);
            assert_eq!(field_of(r), "disk_gb", "{gb}");
        }
        let mut r = req();
        r.disk_gb = Some(20);
        assert_eq!(check(&r), Ok(()));
        let mut r = req();
        r.name = Some("n".repeat(129));
        assert_eq!(field_of(r), "name");
        let mut r = req();
        r.tags.insert("a b".into(), "1".into());
        assert_eq!(field_of(r), "tags");
    }

    #[test]
    fn unknown_fields_are_refused_in_json_and_toml() {
        let e = serde_json::from_str::<JobRequest>(
            r#"{"image":"x","gpus":1,"time_limit_minutes":1,"gpu":2}"#,
        );
        assert!(e.unwrap_err().to_string().contains("unknown field `gpu`"));
        let e = toml::from_str::<JobRequest>(
            "image = \"x\"\ngpus = 1\ntime_limit_minutes = 1\ntime = \"2h\"\n",
        );
        assert!(e.unwrap_err().to_string().contains("unknown field `time`"));
        let ok: JobRequest = toml::from_str(
            "image = \"x\"\ngpus = 2\ntime_limit_minutes = 60\nkind = \"interactive\"\n[env]\nA = \"1\"\n",
        )
        .unwrap();
        assert_eq!(ok.kind, JobKind::Interactive);
        assert_eq!(ok.env["A"], "1");
    }
}
