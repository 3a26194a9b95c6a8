//! The campus overview (`GET /api/v1/overview`, and the portal's home page): every GPU
//! right now (used by its owners, lent to a guest, idle and lendable, withheld or
//! offline), the queue by lab, and the typical wait.
//!
//! Invariant: `withheld` counts offline GPUs too, and each count is the number of map
//! cells in that state.

use serde::{Deserialize, Serialize};

/// The state of one GPU now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum CellState {
    /// Its lab's job, or its lab using it directly.
    Owner,
    /// Another lab's job.
    Guest,
    /// Idle, and the lending rules lend it now.
    Lendable,
    /// Idle but not lent: the rules, a reclaim, a drain or a fault keep it back.
    Withheld,
    /// Its server is offline.
    Offline,
}

impl CellState {
    pub fn as_str(self) -> &'static str {
        match self {
            CellState::Owner => "owner",
            CellState::Guest => "guest",
            CellState::Lendable => "lendable",
            CellState::Withheld => "withheld",
            CellState::Offline => "offline",
        }
    }

    /// In words, for legends and titles.
    pub fn label(self) -> &'static str {
        match self {
            CellState::Owner => "used by its owners",
            CellState::Guest => "lent to a guest",
            CellState::Lendable => "idle and lendable",
            CellState::Withheld => "withheld",
            CellState::Offline => "offline",
        }
    }
}

/// GPUs by state. `withheld` counts offline GPUs too (`offline` says how many of them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuCounts {
    pub total: u32,
    pub owner: u32,
    pub guest: u32,
    pub lendable: u32,
    pub withheld: u32,
    pub offline: u32,
}

impl GpuCounts {
    /// Counts one more GPU in state `s`.
    pub fn add(&mut self, s: CellState) {
        self.total += 1;
        match s {
            CellState::Owner => self.owner += 1,
            CellState::Guest => self.guest += 1,
            CellState::Lendable => self.lendable += 1,
            CellState::Withheld => self.withheld += 1,
            CellState::Offline => {
                self.withheld += 1;
                self.offline += 1
            }
        }
    }
}

/// One GPU on the map.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Cell {
    pub index: i32,
    pub model: String,
    pub memory_gb: i64,
    pub state: CellState,
    pub utilization_pct: i32,
    /// The job holding it, its lab and user.
    pub job: Option<i64>,
    pub job_lab: Option<String>,
    pub user: Option<String>,
    /// Why it is in this state, in words.
    pub why: String,
}

impl Cell {
    /// The cell's tooltip: everything the map knows of the GPU.
    pub fn title(&self) -> String {
        let mut t = format!(
            "GPU {} · {} {} GB · {}",
            self.index,
            self.model,
            self.memory_gb,
            self.state.label()
        );
        if let (Some(job), Some(lab), Some(user)) = (self.job, &self.job_lab, &self.user) {
            t.push_str(&format!(" · job-{job} of {user} (lab {lab})"));
        }
        if self.state != CellState::Offline {
            t.push_str(&format!(" · {}% busy", self.utilization_pct));
        }
        if !self.why.is_empty() {
            t.push_str(&format!(" · {}", self.why));
        }
        t
    }
}

/// One server on the map.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Server {
    pub id: i64,
    pub name: String,
    pub lab: String,
    pub online: bool,
    pub cells: Vec<Cell>,
}

/// One lab's line: its servers' GPUs and its waiting jobs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LabLine {
    pub lab: String,
    /// The GPUs of the lab's own servers.
    pub gpus: GpuCounts,
    /// Jobs of the lab waiting, and the GPUs they ask for.
    pub waiting: u32,
    pub waiting_gpus: u32,
    /// How long the lab's oldest waiting job has waited (seconds).
    pub oldest_wait_s: Option<i64>,
    /// One of the viewer's labs.
    pub mine: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Overview {
    pub gpus: GpuCounts,
    pub waiting: u32,
    pub waiting_gpus: u32,
    /// The median wait of jobs that first started in the last 7 days (seconds).
    pub typical_wait_s: Option<i64>,
    /// How many jobs that median is over.
    pub started_last_7_days: u32,
    pub labs: Vec<LabLine>,
    pub servers: Vec<Server>,
    /// The viewer's own use in each of their labs, against their quotas.
    pub my_use: Vec<MyUse>,
}

/// The viewer's use of one lab's account against their member quota (their own, else
/// the lab's default for members).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MyUse {
    pub lab: String,
    pub gpus_now: u32,
    pub max_gpus: Option<u32>,
    /// GPU-hours over the quota period (the last 7 days).
    pub gpu_hours: f64,
    pub max_gpu_hours: Option<f64>,
}
