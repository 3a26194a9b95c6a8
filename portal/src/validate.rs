//! Input rules, as pure functions. A failed rule names its field.
//!
//! The rules on a job request are `commons_api`'s, shared with the `commons` CLI (which
//! checks with them before it sends anything); this module adds what needs the portal's
//! knowledge (the user's labs) and fills in the defaults. A job request is checked whole
//! before anything is written, so a bad request stores nothing.

use crate::error::AppError;

pub use crate::domain::{JobKind, ValidJob};
pub use commons_api::job::{
    CHECKPOINT_MINUTES, DEFAULT_CPUS, DEFAULT_MEMORY_GB, MAX_COMMAND_BYTES, MAX_CPUS,
    MAX_ENV_BYTES, MAX_GPUS, MAX_GPU_MEMORY_GB, MAX_MEMORY_GB, MAX_TIME_LIMIT_MIN,
};
pub use commons_api::JobRequest;

pub fn slug(field: &str, s: &str) -> Result<(), AppError> {
    Ok(commons_api::rules::slug(field, s)?)
}

pub fn username(s: &str) -> Result<(), AppError> {
    Ok(commons_api::rules::username(s)?)
}

/// A Docker image reference: `[host[:port]/]path[:tag][@sha256:<64 hex>]`.
pub fn image_reference(s: &str) -> Result<(), AppError> {
    Ok(commons_api::rules::image_reference(s)?)
}

/// Checks a request against the rules and the labs the user belongs to (slug -> id).
pub fn job(req: JobRequest, user_labs: &[(String, i64)]) -> Result<ValidJob, AppError> {
    commons_api::job::check(&req)?;
    let image = req.image.trim().to_string();
    let min_mem = req.min_gpu_memory_gb.unwrap_or(0.0);
    let gpu_share = commons_api::job::gpu_share(&req)?;
    let cpus = req.cpus.unwrap_or(DEFAULT_CPUS);
    let mem = req.memory_gb.unwrap_or(DEFAULT_MEMORY_GB);
    let memory_mb = (mem * 1024.0).round() as i64;
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
        kind: match req.kind {
            commons_api::JobKind::Batch => JobKind::Batch,
            commons_api::JobKind::Interactive => JobKind::Interactive,
        },
        lab_id,
        checkpoint_interval_s: req.checkpoint_minutes.map(|m| m * 60),
        shm_mb: req.shm_mb,
        disk_gb: req.disk_gb,
        image_digest: None,
        image_signature: None,
        image_campus: false,
        name: req.name.map(|n| n.trim().to_string()),
        tags: req.tags,
        after: req.after,
        gpu_share,
        inputs: req.inputs,
        datasets: req.datasets,
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
    fn the_test_kits_demo_job_is_what_the_rules_make() {
        let r: JobRequest = serde_json::from_str(
            r#"{"image":"commons-demo:latest","gpus":1,"time_limit_minutes":5}"#,
        )
        .unwrap();
        let labs = [("vision".to_string(), 7)];
        assert_eq!(job(r, &labs).unwrap(), crate::db::testkit::demo_job(7));
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

    /// The job rules themselves are tested in `commons-api`; here, that they apply and
    /// that the portal's own check (the lab) names its field.
    #[test]
    fn the_rules_apply_and_the_lab_is_checked() {
        let mut r = req();
        r.image = "Not An Image".into();
        assert_eq!(field_of(r), "image");
        let mut r = req();
        r.lab = Some("physics".into());
        assert_eq!(field_of(r), "lab");
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
