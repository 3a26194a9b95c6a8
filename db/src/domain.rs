//! The portal's closed sets of values (job and attempt states, job kinds, membership
//! roles and sources) and the plain data the database layer stores as it is handed it
//! (a checked job request, a checked SSH key, a verified login). Any layer may use them;
//! they live here, under the database layer, because their columns are read and written
//! through them.
//!
//! Invariant: text that is not one of the listed values is an error wherever it is read
//! (a database row, a form, a request), never a silent default. In the database they are
//! `Text` columns read and written through diesel's `FromSql`/`ToSql` (implemented in
//! `types`), so a damaged row fails its query instead of turning into `Failed` or
//! `Member`.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Text that names none of an enum's values.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{value:?} is not a known {what}")]
pub struct UnknownValue {
    pub what: &'static str,
    pub value: String,
}

macro_rules! text_enum {
    ($(#[$m:meta])* $name:ident ($what:literal) { $($(#[$vm:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
                 diesel::AsExpression, diesel::FromSqlRow)]
        #[serde(rename_all = "snake_case")]
        #[diesel(sql_type = diesel::sql_types::Text)]
        pub enum $name { $($(#[$vm])* $variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl std::str::FromStr for $name {
            type Err = UnknownValue;
            fn from_str(s: &str) -> Result<Self, UnknownValue> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownValue { what: $what, value: s.to_string() }),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

text_enum!(
    /// A job's state, as users and the API see it.
    JobState ("job state") {
        Queued => "queued",
        Starting => "starting",
        Running => "running",
        Preempting => "preempting",
        Succeeded => "succeeded",
        Failed => "failed",
        Cancelled => "cancelled",
    }
);

impl JobState {
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

text_enum!(
    /// An attempt's state in the portal. Active attempts hold their GPUs.
    AttemptStatus ("attempt state") {
        Starting => "starting",
        Running => "running",
        Stopping => "stopping",
        Exited => "exited",
        Stopped => "stopped",
        Failed => "failed",
        Lost => "lost",
    }
);

impl AttemptStatus {
    pub const ACTIVE: [AttemptStatus; 3] = [Self::Starting, Self::Running, Self::Stopping];
    pub fn is_active(self) -> bool {
        Self::ACTIVE.contains(&self)
    }
}

text_enum!(
    /// A member's role in a lab.
    Role ("lab role") {
        Member => "member",
        Admin => "admin",
    }
);

text_enum!(
    /// Who granted a membership: a lab admin by hand (kept across logins) or an SSO
    /// group rule (refreshed at every login).
    MembershipSource ("membership source") {
        Manual => "manual",
        Sso => "sso",
    }
);

text_enum!(
    /// A batch job runs its command; an interactive one waits for its user.
    JobKind ("job kind") {
        Batch => "batch",
        Interactive => "interactive",
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_enums_round_trip_and_refuse_unknown_text() {
        for s in JobState::ALL {
            assert_eq!(s.as_str().parse::<JobState>(), Ok(*s));
        }
        for s in AttemptStatus::ALL {
            assert_eq!(s.as_str().parse::<AttemptStatus>(), Ok(*s));
        }
        for s in Role::ALL {
            assert_eq!(s.as_str().parse::<Role>(), Ok(*s));
        }
        let e = "finished".parse::<JobState>().unwrap_err();
        assert_eq!(e.to_string(), "\"finished\" is not a known job state");
        assert!("owner".parse::<Role>().is_err());
        assert!("".parse::<MembershipSource>().is_err());
        assert!(JobState::Cancelled.is_final());
        assert!(!JobState::Preempting.is_final());
        assert!(AttemptStatus::Stopping.is_active());
        assert!(!AttemptStatus::Lost.is_active());
    }
}

/// A request that passed every rule, with defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidJob {
    pub image: String,
    pub command: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
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
    /// GiB; none: the campus default, applied when the job is placed and started.
    pub disk_gb: Option<i64>,
    /// The allow-list's pin for `image` (set by the portal's submission, not by its
    /// request rules, which know nothing of the allow-list).
    pub image_digest: Option<String>,
    pub image_signature: Option<String>,
    /// The pin came from the campus allow-list (not the lab's own).
    pub image_campus: bool,
    /// The job's name (trimmed), if it has one.
    pub name: Option<String>,
    pub tags: std::collections::BTreeMap<String, String>,
    /// The jobs it waits for; checked by the portal (they exist and are the user's).
    pub after: Vec<commons_api::flows::After>,
    /// Its inputs as written; checked by the portal (they exist, the user may read them).
    pub inputs: Vec<String>,
    /// The datasets it mounts; checked by the portal (registered, visible to the user).
    pub datasets: Vec<commons_api::datasets::JobDataset>,
    /// A share of its one GPU: (compute in thousandths, memory in MiB), either 0 for
    /// "from the other"; none: whole GPUs.
    pub gpu_share: Option<(u32, u64)>,
}

/// A key that passed every check, ready to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedKey {
    /// The name the user gave, else the key's comment, else one made from the key.
    pub name: String,
    /// The algorithm's SSH name, e.g. `ssh-ed25519`.
    pub algorithm: String,
    /// `SHA256:...` as OpenSSH prints it.
    pub fingerprint: String,
    /// The canonical OpenSSH one-line form.
    pub public_key: String,
}

/// A verified login: the ID token's claims that matter to us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub issuer: String,
    pub subject: String,
    pub username: String,
    pub email: String,
    /// The provider vouches for the e-mail (`email_verified`); only then may the login
    /// take over an account the operators made by hand for that address.
    pub email_verified: bool,
    pub name: String,
    pub groups: Vec<String>,
    /// For RP-initiated logout.
    pub id_token: String,
}
