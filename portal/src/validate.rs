//! Input rules, as pure functions. A failed rule names its field.
//!
//! A job request is checked whole before anything is written, so a bad request stores
//! nothing.

use crate::error::AppError;
use serde::Deserialize;
use std::collections::BTreeMap;

pub const MAX_GPUS: i64 = 16;
pub const MAX_TIME_LIMIT_MIN: i64 = 30 * 24 * 60;
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
pub const MAX_ENV_BYTES: usize = 64 * 1024;
pub const MAX_CPUS: f64 = 512.0;
pub const MAX_MEMORY_GB: f64 = 4096.0;
pub const MAX_GPU_MEMORY_GB: f64 = 1024.0;
pub const DEFAULT_CPUS: f64 = 4.0;
pub const DEFAULT_MEMORY_GB: f64 = 16.0;

pub fn slug(field: &str, s: &str) -> Result<(), AppError> {
    let ok = !s.is_empty()
        && s.len() <= 40
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(AppError::invalid(
            field,
            "use 1 to 40 characters: lower-case letters, digits and '-'",
        ))
    }
}

pub fn username(s: &str) -> Result<(), AppError> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(AppError::invalid(
            "username",
            "use 1 to 64 characters: letters, digits, '-', '_' and '.'",
        ))
    }
}

/// A Docker image reference: `[host[:port]/]path[:tag][@sha256:<64 hex>]`.
pub fn image_reference(s: &str) -> Result<(), AppError> {
    let bad = |why: &str| {
        Err(AppError::invalid(
            "image",
            format!("{s:?} is not a valid image reference: {why}"),
        ))
    };
    if s.is_empty() {
        return Err(AppError::invalid("image", "an image is required"));
    }
    if s.len() > 512 {
        return bad("longer than 512 characters");
    }
    let (rest, digest) = match s.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (s, None),
    };
    if let Some(d) = digest {
        let hex = d.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64
            || !hex
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        {
            return bad("a digest is sha256: and 64 lower-case hex digits");
        }
    }
    // A tag follows the last ':' that comes after the last '/'.
    let last_slash = rest.rfind('/').map(|i| i + 1).unwrap_or(0);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(t) = tag {
        let ok = !t.is_empty()
            && t.len() <= 128
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
            && !t.starts_with(['.', '-']);
        if !ok {
            return bad("a tag is 1 to 128 letters, digits, '_', '.' or '-'");
        }
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    if parts.len() > 1 && (parts[0].contains(['.', ':']) || parts[0] == "localhost") {
        let host = parts.remove(0);
        let (h, port) = host.split_once(':').unwrap_or((host, ""));
        let host_ok = !h.is_empty()
            && h.chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-".contains(c))
            && (port.is_empty() || port.parse::<u16>().is_ok());
        if !host_ok {
            return bad("the registry host is not valid");
        }
    }
    for p in &parts {
        let ok = !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
            && p.starts_with(|c: char| c.is_ascii_alphanumeric())
            && p.ends_with(|c: char| c.is_ascii_alphanumeric());
        if !ok {
            return bad(
                "path components are lower-case letters, digits and '.', '_' or '-' between them",
            );
        }
    }
    Ok(())
}

pub use crate::domain::JobKind;

/// A job as submitted, through the API or the form.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobRequest {
    pub image: String,
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub gpus: i64,
    #[serde(default)]
    pub gpu_models: Vec<String>,
    #[serde(default)]
    pub min_gpu_memory_gb: Option<f64>,
    #[serde(default)]
    pub cpus: Option<f64>,
    #[serde(default)]
    pub memory_gb: Option<f64>,
    pub time_limit_minutes: i64,
    #[serde(default = "batch")]
    pub kind: JobKind,
    /// Slug of the lab to charge; may be left out when the user is in one lab.
    #[serde(default)]
    pub lab: Option<String>,
    /// Snapshot `/checkpoint` every this many minutes while the job runs (besides the
    /// upload when it is stopped).
    #[serde(default)]
    pub checkpoint_minutes: Option<i64>,
    /// The size of `/dev/shm` in MiB (PyTorch's data loaders use it); at most the job's
    /// memory. None: 64 MiB.
    #[serde(default)]
    pub shm_mb: Option<i64>,
}

/// The least CPU share the Docker Engine accepts.
pub const MIN_CPUS: f64 = 0.01;

/// The most often a job may ask for periodic checkpoints, and the least.
pub const CHECKPOINT_MINUTES: std::ops::RangeInclusive<i64> = 1..=1440;

fn batch() -> JobKind {
    JobKind::Batch
}

/// A request that passed every rule, with defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidJob {
    pub image: String,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub gpus: i32,
    pub gpu_models: Vec<String>,
    pub min_gpu_memory_mb: i64,
    pub cpus: f64,
    pub memory_mb: i64,
    pub time_limit_s: i64,
    pub kind: JobKind,
    pub lab_id: i64,
    pub checkpoint_interval_s: Option<i64>,
    pub shm_mb: Option<i64>,
}

/// Checks a request against the rules and the labs the user belongs to (slug -> id).
pub fn job(req: JobRequest, user_labs: &[(String, i64)]) -> Result<ValidJob, AppError> {
    let image = req.image.trim().to_string();
    image_reference(&image)?;
    let command_bytes: usize = req.command.iter().map(|a| a.len() + 1).sum();
    if command_bytes > MAX_COMMAND_BYTES {
        return Err(AppError::invalid(
            "command",
            format!(
                "the command is {command_bytes} bytes; at most {MAX_COMMAND_BYTES} are allowed"
            ),
        ));
    }
    if req.command.iter().any(|a| a.contains('\0')) {
        return Err(AppError::invalid(
            "command",
            "the command contains a NUL byte",
        ));
    }
    let env_bytes: usize = req.env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    if env_bytes > MAX_ENV_BYTES {
        return Err(AppError::invalid(
            "env",
            format!("the environment is {env_bytes} bytes; at most {MAX_ENV_BYTES} are allowed"),
        ));
    }
    for k in req.env.keys() {
        let ok = !k.is_empty()
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !k.starts_with(|c: char| c.is_ascii_digit());
        if !ok {
            return Err(AppError::invalid(
                "env",
                format!("{k:?} is not a valid variable name"),
            ));
        }
        if k.starts_with("COMMONS_") {
            return Err(AppError::invalid(
                "env",
                format!("{k} is reserved: COMMONS_ variables are set by GPU Commons"),
            ));
        }
        if k.starts_with("NVIDIA_") || k == "CUDA_VISIBLE_DEVICES" {
            return Err(AppError::invalid(
                "env",
                format!("{k} is set by GPU Commons from the GPUs the job gets; leave it out"),
            ));
        }
    }
    if let Some((k, _)) = req
        .env
        .iter()
        .find(|(k, v)| k.contains('\0') || v.contains('\0'))
    {
        return Err(AppError::invalid("env", format!("{k:?} holds a NUL byte")));
    }
    if !(1..=MAX_GPUS).contains(&req.gpus) {
        return Err(AppError::invalid(
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
        return Err(AppError::invalid(
            "gpu_models",
            "list at most 16 GPU model names, each 1 to 64 characters",
        ));
    }
    let min_mem = req.min_gpu_memory_gb.unwrap_or(0.0);
    if !(0.0..=MAX_GPU_MEMORY_GB).contains(&min_mem) {
        return Err(AppError::invalid(
            "min_gpu_memory_gb",
            format!("must be between 0 and {MAX_GPU_MEMORY_GB}"),
        ));
    }
    let cpus = req.cpus.unwrap_or(DEFAULT_CPUS);
    if !(MIN_CPUS..=MAX_CPUS).contains(&cpus) {
        return Err(AppError::invalid(
            "cpus",
            format!(
                "must be at least {MIN_CPUS} (the container engine's least) and at most {MAX_CPUS}"
            ),
        ));
    }
    let mem = req.memory_gb.unwrap_or(DEFAULT_MEMORY_GB);
    if !(0.0625..=MAX_MEMORY_GB).contains(&mem) {
        return Err(AppError::invalid(
            "memory_gb",
            format!("must be between 0.0625 and {MAX_MEMORY_GB}"),
        ));
    }
    if !(1..=MAX_TIME_LIMIT_MIN).contains(&req.time_limit_minutes) {
        return Err(AppError::invalid(
            "time_limit_minutes",
            format!("must be 1 to {MAX_TIME_LIMIT_MIN} minutes (30 days)"),
        ));
    }
    if let Some(m) = req.checkpoint_minutes {
        if !CHECKPOINT_MINUTES.contains(&m) {
            return Err(AppError::invalid(
                "checkpoint_minutes",
                format!(
                    "must be {} to {} minutes between checkpoints",
                    CHECKPOINT_MINUTES.start(),
                    CHECKPOINT_MINUTES.end()
                ),
            ));
        }
    }
    let memory_mb = (mem * 1024.0).round() as i64;
    if let Some(shm) = req.shm_mb {
        if !(1..=memory_mb).contains(&shm) {
            return Err(AppError::invalid(
                "shm_mb",
                format!("/dev/shm must be 1 to {memory_mb} MiB (the job's memory)"),
            ));
        }
    }
    let lab_id = match (&req.lab, user_labs) {
        (Some(slug), labs) => labs
            .iter()
            .find(|(s, _)| s == slug)
            .map(|(_, id)| *id)
            .ok_or_else(|| {
                AppError::invalid("lab", format!("you are not a member of lab {slug:?}"))
            })?,
        (None, [(_, id)]) => *id,
        (None, []) => {
            return Err(AppError::invalid(
                "lab",
                "you are not a member of any lab; ask a lab admin to add you",
            ))
        }
        (None, _) => {
            return Err(AppError::invalid(
                "lab",
                "you are in several labs: say which one to charge",
            ))
        }
    };
    Ok(ValidJob {
        image,
        command: req.command,
        env: req.env,
        gpus: req.gpus as i32,
        gpu_models: req
            .gpu_models
            .into_iter()
            .map(|m| m.trim().to_string())
            .collect(),
        min_gpu_memory_mb: (min_mem * 1024.0).round() as i64,
        cpus,
        memory_mb,
        time_limit_s: req.time_limit_minutes * 60,
        kind: req.kind,
        lab_id,
        checkpoint_interval_s: req.checkpoint_minutes.map(|m| m * 60),
        shm_mb: req.shm_mb,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> JobRequest {
        serde_json::from_str(r#"{"image":"commons-demo:latest","command":["sh","-c","echo hi"],"gpus":1,"time_limit_minutes":10}"#).unwrap()
    }
    fn labs() -> Vec<(String, i64)> {
        vec![("vision".into(), 1)]
    }
    fn field_of(r: JobRequest) -> String {
        job(r, &labs()).unwrap_err().field().unwrap().to_string()
    }

    #[test]
    fn gpu_selection_nul_bytes_tiny_cpus_and_big_shm_are_refused() {
        for (k, v) in [
            ("NVIDIA_VISIBLE_DEVICES", "all"),
            ("NVIDIA_DRIVER_CAPABILITIES", "all"),
            ("CUDA_VISIBLE_DEVICES", "0,1"),
            ("OK", "a\0b"),
        ] {
            let mut r = req();
            r.env.insert(k.into(), v.into());
            let e = job(r, &labs()).unwrap_err();
            assert_eq!(e.field(), Some("env"), "{k}");
            assert_eq!(
                e.status(),
                actix_web::http::StatusCode::UNPROCESSABLE_ENTITY
            );
        }
        let mut r = req();
        r.cpus = Some(0.001);
        assert_eq!(field_of(r), "cpus", "below the engine's least");
        let mut r = req();
        r.cpus = Some(0.01);
        assert!(job(r, &labs()).is_ok());
        let mut r = req();
        r.memory_gb = Some(1.0);
        r.shm_mb = Some(2048);
        assert_eq!(field_of(r), "shm_mb", "more /dev/shm than memory");
        let mut r = req();
        r.shm_mb = Some(512);
        assert_eq!(job(r, &labs()).unwrap().shm_mb, Some(512));
    }

    #[test]
    fn valid_request_gets_defaults() {
        let v = job(req(), &labs()).unwrap();
        assert_eq!(v.lab_id, 1);
        assert_eq!(v.cpus, DEFAULT_CPUS);
        assert_eq!(v.time_limit_s, 600);
        assert_eq!(v.kind, JobKind::Batch);
    }

    #[test]
    fn image_references() {
        for ok in [
            "busybox",
            "commons-demo:latest",
            "registry.campus.edu:5000/vision/train:v1.2",
            "localhost/x",
            &format!("pytorch/pytorch@sha256:{}", "a".repeat(64)),
        ] {
            assert!(image_reference(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "UPPER",
            "a b",
            "x:",
            "x@sha256:12",
            "-x",
            "a//b",
            "x:tag with space",
        ] {
            assert!(image_reference(bad).is_err(), "{bad}");
        }
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
        r.lab = Some("physics".into());
        assert_eq!(field_of(r), "lab");
        let mut r = req();
        r.env.insert("COMMONS_JOB_ID".into(), "1".into());
        assert_eq!(field_of(r), "env");
        let mut r = req();
        r.cpus = Some(f64::NAN);
        assert_eq!(field_of(r), "cpus");
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = serde_json::from_str::<JobRequest>(
            r#"{"image":"x","gpus":1,"time_limit_minutes":1,"gpu":2}"#,
        );
        assert!(e.unwrap_err().to_string().contains("unknown field `gpu`"));
    }

    #[test]
    fn lab_must_be_named_when_ambiguous() {
        let two = vec![("a".to_string(), 1), ("b".to_string(), 2)];
        assert_eq!(job(req(), &two).unwrap_err().field(), Some("lab"));
        assert_eq!(job(req(), &[]).unwrap_err().field(), Some("lab"));
    }
}
