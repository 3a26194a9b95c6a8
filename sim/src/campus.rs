//! The campus file: which labs exist, which trace tenants (Philly VCs) each lab
//! submits for, and the servers each lab owns.
//!
//! The file is TOML, read into [`CampusFile`] with `deny_unknown_fields`, then checked
//! once by [`CampusFile::build`], which turns it into a [`Campus`] with one entry per
//! node. Invariants of a built [`Campus`]:
//! - lab names are unique and not empty; every tenant belongs to at most one lab;
//! - every node belongs to an existing lab and has at least one GPU;
//! - departures name an existing node and return (if at all) after they leave.
//!
//! Every validation error names the field it is about, e.g. `lab[3].gpus_per_node`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// What can be wrong with a campus file.
#[derive(Debug, thiserror::Error)]
pub enum CampusError {
    #[error("cannot read campus file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("campus file {path} is not valid: {source}")]
    Parse {
        path: String,
        source: Box<toml::de::Error>,
    },
    #[error("campus file: `{field}` {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> CampusError {
    CampusError::Invalid {
        field: field.into(),
        message: message.into(),
    }
}

/// The campus file as written by a person.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CampusFile {
    /// Seconds a preempted guest job has to checkpoint and stop (SIGTERM to stop).
    #[serde(default = "default_grace")]
    pub grace_seconds: u32,
    /// Minutes between the periodic checkpoints of every job (measured from the start of
    /// each attempt). 0 means no checkpoints: a stopped job restarts from scratch.
    #[serde(default = "default_checkpoint")]
    pub checkpoint_interval_minutes: u32,
    /// Whether a job also writes a checkpoint within its grace period when it is told to
    /// stop (DESIGN step 7). Off by default: the figures then assume that only the
    /// periodic checkpoints survive, which is the worst case.
    #[serde(default)]
    pub checkpoint_on_stop: bool,
    /// The labs, in the order their nodes are numbered.
    #[serde(default)]
    pub lab: Vec<LabFile>,
    /// Servers that leave the federation for a while (their owner takes them away).
    #[serde(default)]
    pub departure: Vec<DepartureFile>,
}

fn default_grace() -> u32 {
    120
}
fn default_checkpoint() -> u32 {
    30
}
fn default_gpus_per_node() -> u32 {
    8
}
fn default_model() -> String {
    "A100-80GB".into()
}

/// One lab of the campus file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LabFile {
    /// Short unique name, e.g. "vision"; nodes are called `<name>-<index>`.
    pub name: String,
    /// Trace tenants (Philly VCs) whose jobs this lab submits.
    #[serde(default)]
    pub tenants: Vec<String>,
    /// Servers the lab owns; 0 makes a borrow-only lab.
    #[serde(default)]
    pub nodes: u32,
    /// GPUs in each of the lab's servers.
    #[serde(default = "default_gpus_per_node")]
    pub gpus_per_node: u32,
    /// GPU model of the lab's servers, as an agent would report it.
    #[serde(default = "default_model")]
    pub gpu_model: String,
    /// Memory of one GPU in GB (0: unknown, derived from a model name ending in `-<N>GB`).
    #[serde(default)]
    pub gpu_memory_gb: u32,
    /// Whether the lab's nodes lend idle GPUs to other labs under the `commons`
    /// policies: "always" (default) or "never".
    #[serde(default)]
    pub lend: Lend,
    /// At most this many GPUs of each of the lab's nodes lent at once (`commons` only).
    #[serde(default)]
    pub max_lent_gpus_per_node: Option<u32>,
    /// Operator quota: at most this many GPUs borrowed from other labs at once
    /// (`commons` only).
    #[serde(default)]
    pub max_borrowed_gpus: Option<u32>,
}

/// A lab's lending rule for its nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lend {
    #[default]
    Always,
    Never,
}

/// A node that leaves at `leave_at_s` (seconds after the first submission of the trace)
/// and, if `return_at_s` is set, comes back then.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DepartureFile {
    /// Node name, `<lab>-<index>` with index from 0.
    pub node: String,
    /// When it leaves: running jobs get the grace period, then stop and are requeued.
    pub leave_at_s: i64,
    /// When it comes back, empty; absent: it never does.
    #[serde(default)]
    pub return_at_s: Option<i64>,
    /// The node vanishes at once (power cut) instead of draining within the grace period.
    #[serde(default)]
    pub abrupt: bool,
}

/// A lab of a built campus.
#[derive(Debug, Clone, PartialEq)]
pub struct Lab {
    pub name: String,
    pub tenants: Vec<String>,
    pub gpu_model: String,
    pub lend: Lend,
    pub max_lent_gpus_per_node: Option<u32>,
    pub max_borrowed_gpus: Option<u32>,
}

/// A server of a built campus.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    pub name: String,
    /// Index into [`Campus::labs`] of the owner.
    pub lab: usize,
    pub gpus: u32,
    pub model: String,
    pub memory_mb: u64,
}

/// A departure of a built campus.
#[derive(Debug, Clone, PartialEq)]
pub struct Departure {
    /// Index into [`Campus::nodes`].
    pub node: usize,
    pub leave_at: i64,
    pub return_at: Option<i64>,
    pub abrupt: bool,
}

/// A validated campus, one entry per node.
#[derive(Debug, Clone, PartialEq)]
pub struct Campus {
    pub grace_s: i64,
    /// `None`: no checkpoints.
    pub checkpoint_interval_s: Option<i64>,
    pub checkpoint_on_stop: bool,
    pub labs: Vec<Lab>,
    pub nodes: Vec<NodeSpec>,
    pub departures: Vec<Departure>,
}

impl CampusFile {
    /// Read and parse a campus file (not yet validated: call [`CampusFile::build`]).
    pub fn read(path: &Path) -> Result<CampusFile, CampusError> {
        let text = std::fs::read_to_string(path).map_err(|source| CampusError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            CampusError::Parse { source, .. } => CampusError::Parse {
                path: path.display().to_string(),
                source,
            },
            other => other,
        })
    }

    /// Parse campus TOML text.
    pub fn parse(text: &str) -> Result<CampusFile, CampusError> {
        toml::from_str(text).map_err(|e| CampusError::Parse {
            path: "<text>".into(),
            source: Box::new(e),
        })
    }

    /// Validate and expand into a [`Campus`].
    pub fn build(&self) -> Result<Campus, CampusError> {
        if self.lab.is_empty() {
            return Err(invalid("lab", "must list at least one [[lab]]"));
        }
        if self.grace_seconds > 86_400 {
            return Err(invalid("grace_seconds", "must be at most 86400 (one day)"));
        }
        let mut labs = Vec::new();
        let mut nodes = Vec::new();
        let mut names: BTreeMap<&str, usize> = BTreeMap::new();
        let mut tenants: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, l) in self.lab.iter().enumerate() {
            l.check(i, &mut names, &mut tenants)?;
            let memory_gb = if l.gpu_memory_gb > 0 {
                l.gpu_memory_gb
            } else {
                memory_from_model(&l.gpu_model)
            };
            let name = l.name.trim();
            for n in 0..l.nodes {
                nodes.push(NodeSpec {
                    name: format!("{name}-{n}"),
                    lab: i,
                    gpus: l.gpus_per_node,
                    model: l.gpu_model.clone(),
                    memory_mb: u64::from(memory_gb) * 1024,
                });
            }
            labs.push(Lab {
                name: name.to_string(),
                tenants: l.tenants.clone(),
                gpu_model: l.gpu_model.clone(),
                lend: l.lend,
                max_lent_gpus_per_node: l.max_lent_gpus_per_node,
                max_borrowed_gpus: l.max_borrowed_gpus,
            });
        }
        if nodes.is_empty() {
            return Err(invalid("lab", "no lab owns a node: the campus has no GPUs"));
        }
        let departures = self.departures(&nodes)?;
        Ok(Campus {
            grace_s: i64::from(self.grace_seconds),
            checkpoint_interval_s: (self.checkpoint_interval_minutes > 0)
                .then(|| i64::from(self.checkpoint_interval_minutes) * 60),
            checkpoint_on_stop: self.checkpoint_on_stop,
            labs,
            nodes,
            departures,
        })
    }

    /// The departures, checked against the built `nodes`.
    fn departures(&self, nodes: &[NodeSpec]) -> Result<Vec<Departure>, CampusError> {
        let mut departures = Vec::new();
        for (i, d) in self.departure.iter().enumerate() {
            let f = |name: &str| format!("departure[{i}].{name}");
            let node = nodes
                .iter()
                .position(|n| n.name == d.node)
                .ok_or_else(|| invalid(f("node"), format!("no node is called \"{}\"", d.node)))?;
            if d.leave_at_s < 0 {
                return Err(invalid(f("leave_at_s"), "must not be negative"));
            }
            if let Some(r) = d.return_at_s {
                if r <= d.leave_at_s {
                    return Err(invalid(f("return_at_s"), "must be after leave_at_s"));
                }
            }
            departures.push(Departure {
                node,
                leave_at: d.leave_at_s,
                return_at: d.return_at_s,
                abrupt: d.abrupt,
            });
        }
        Ok(departures)
    }
}

impl LabFile {
    /// Check lab `i` of the file; `names` and `tenants` collect what earlier labs took.
    fn check<'a>(
        &'a self,
        i: usize,
        names: &mut BTreeMap<&'a str, usize>,
        tenants: &mut BTreeMap<&'a str, usize>,
    ) -> Result<(), CampusError> {
        let f = |name: &str| format!("lab[{i}].{name}");
        let name = self.name.trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(invalid(f("name"), "must be a non-empty word"));
        }
        if let Some(j) = names.insert(name, i) {
            return Err(invalid(
                f("name"),
                format!("\"{name}\" is already the name of lab[{j}]"),
            ));
        }
        for t in &self.tenants {
            if t.trim().is_empty() {
                return Err(invalid(f("tenants"), "has an empty tenant name"));
            }
            if let Some(j) = tenants.insert(t.as_str(), i) {
                return Err(invalid(
                    f("tenants"),
                    format!("tenant \"{t}\" is already a tenant of lab[{j}]"),
                ));
            }
        }
        if self.nodes > 0 && self.gpus_per_node == 0 {
            return Err(invalid(f("gpus_per_node"), "must be at least 1"));
        }
        if self.gpus_per_node > 64 {
            return Err(invalid(f("gpus_per_node"), "must be at most 64"));
        }
        if self.nodes > 10_000 {
            return Err(invalid(f("nodes"), "must be at most 10000"));
        }
        if self.gpu_model.trim().is_empty() {
            return Err(invalid(f("gpu_model"), "must not be empty"));
        }
        Ok(())
    }
}

/// "A100-80GB" -> 80; anything else -> 0 (unknown).
fn memory_from_model(model: &str) -> u32 {
    model
        .rsplit('-')
        .next()
        .and_then(|s| s.strip_suffix("GB"))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

impl Campus {
    /// Total GPUs of all nodes (whether or not they leave for a while).
    pub fn total_gpus(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.gpus)).sum()
    }

    /// The most GPUs any single node has.
    pub fn max_node_gpus(&self) -> u32 {
        self.nodes.iter().map(|n| n.gpus).max().unwrap_or(0)
    }

    /// Which lab submits for a trace tenant.
    pub fn lab_of_tenant(&self) -> BTreeMap<&str, usize> {
        let mut m = BTreeMap::new();
        for (i, l) in self.labs.iter().enumerate() {
            for t in &l.tenants {
                m.insert(t.as_str(), i);
            }
        }
        m
    }

    /// Add `count` random departures, drawn from `seed`: a uniformly chosen node leaves at
    /// a uniform time in `[0, span_s)`, drains within the grace period and returns after
    /// one to 24 hours. The same seed always gives the same departures.
    pub fn add_random_departures(&mut self, count: u32, span_s: i64, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..count {
            let node = rng.random_range(0..self.nodes.len());
            let leave_at = rng.random_range(0..span_s.max(1));
            let away = rng.random_range(3_600..=86_400);
            self.departures.push(Departure {
                node,
                leave_at,
                return_at: Some(leave_at + away),
                abrupt: false,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(text: &str) -> Result<Campus, CampusError> {
        CampusFile::parse(text)?.build()
    }

    #[test]
    fn example_from_the_issue_builds() {
        let c = build(
            r#"
            grace_seconds = 120
            checkpoint_interval_minutes = 30
            [[lab]]
            name = "vision"
            tenants = ["ee9e8c"]
            nodes = 12
            gpus_per_node = 8
            gpu_model = "A100-80GB"
            "#,
        )
        .unwrap();
        assert_eq!(c.nodes.len(), 12);
        assert_eq!(c.total_gpus(), 96);
        assert_eq!(c.nodes[3].name, "vision-3");
        assert_eq!(c.nodes[0].memory_mb, 80 * 1024);
        assert_eq!(c.checkpoint_interval_s, Some(1800));
        assert_eq!(c.grace_s, 120);
    }

    #[test]
    fn zero_interval_means_no_checkpoints() {
        let c =
            build("checkpoint_interval_minutes = 0\n[[lab]]\nname = \"a\"\nnodes = 1\n").unwrap();
        assert_eq!(c.checkpoint_interval_s, None);
    }

    #[test]
    fn lending_rules_and_quota_are_read() {
        let c =
            build("[[lab]]\nname = \"a\"\nnodes = 1\nlend = \"never\"\nmax_borrowed_gpus = 4\n")
                .unwrap();
        assert_eq!(c.labs[0].lend, Lend::Never);
        assert_eq!(c.labs[0].max_borrowed_gpus, Some(4));
        let e = build("[[lab]]\nname = \"a\"\nnodes = 1\nlend = \"sometimes\"\n").unwrap_err();
        assert!(e.to_string().contains("lend"), "{e}");
    }

    #[test]
    fn unknown_field_is_named() {
        let e = build("[[lab]]\nname = \"a\"\nnodes = 1\ngpus = 4\n").unwrap_err();
        assert!(e.to_string().contains("gpus"), "{e}");
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("", "`lab`"),
            ("[[lab]]\nname = \"a\"\n", "`lab`"),
            (
                "[[lab]]\nname = \"a\"\nnodes = 1\n[[lab]]\nname = \"a\"\n",
                "lab[1].name",
            ),
            (
                "[[lab]]\nname = \"a\"\nnodes = 1\ntenants = [\"x\"]\n[[lab]]\nname = \"b\"\ntenants = [\"x\"]\n",
                "lab[1].tenants",
            ),
            (
                "[[lab]]\nname = \"a\"\nnodes = 1\ngpus_per_node = 0\n",
                "lab[0].gpus_per_node",
            ),
            (
                "[[lab]]\nname = \"a\"\nnodes = 1\n[[departure]]\nnode = \"a-5\"\nleave_at_s = 1\n",
                "departure[0].node",
            ),
            (
                "[[lab]]\nname = \"a\"\nnodes = 1\n[[departure]]\nnode = \"a-0\"\nleave_at_s = 10\nreturn_at_s = 5\n",
                "departure[0].return_at_s",
            ),
        ];
        for (text, field) in cases {
            let e = build(text).unwrap_err().to_string();
            assert!(e.contains(field), "{text:?}: {e}");
        }
    }

    #[test]
    fn random_departures_depend_only_on_the_seed() {
        let mut a = build("[[lab]]\nname = \"a\"\nnodes = 4\n").unwrap();
        let mut b = a.clone();
        a.add_random_departures(5, 1000, 7);
        b.add_random_departures(5, 1000, 7);
        assert_eq!(a, b);
        assert_eq!(a.departures.len(), 5);
        assert!(a.departures.iter().all(|d| d.leave_at < 1000));
    }
}
