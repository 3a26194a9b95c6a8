//! `[files]`: users' and labs' file spaces in the campus object store (the store of
//! `[checkpoints]`, under `files/`), and the quotas that bound them.

use serde::Deserialize;

/// Quotas of the file spaces, in GB (10^9 bytes), counted as the bytes of an upload
/// arrive. Operators set a lab's own (`PUT /api/v1/labs/{slug}/files-quota`); a lab's
/// admins set their members' (`.../members/{username}/files-quota`), and a user's quota
/// is the largest any of their labs set, else `user_quota_gb`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilesConfig {
    /// Each user's own space, unless a lab's admin set theirs.
    pub user_quota_gb: f64,
    /// Each lab's shared space, unless an operator set the lab's.
    pub lab_quota_gb: f64,
    /// An S3 store: the lab servers read a job's inputs and `lab:` datasets straight from
    /// the bucket, through the store's presigned URLs of one object each (they must reach
    /// its endpoint). `false`: through the portal's own signed URLs, the portal streaming
    /// each object (servers that cannot reach the bucket). A local store always does that.
    pub agents_read_from_store: bool,
}

impl Default for FilesConfig {
    fn default() -> Self {
        Self {
            user_quota_gb: 50.0,
            lab_quota_gb: 500.0,
            agents_read_from_store: true,
        }
    }
}

impl FilesConfig {
    pub(super) fn validate(&self) -> anyhow::Result<()> {
        for (name, v) in [
            ("files.user_quota_gb", self.user_quota_gb),
            ("files.lab_quota_gb", self.lab_quota_gb),
        ] {
            anyhow::ensure!(
                v.is_finite() && v >= 0.0,
                "{name} must be a number of GB, 0 or more; got {v}"
            );
        }
        Ok(())
    }
}
