//! The agent's Prometheus metrics and the small HTTP listener that serves them
//! (`--metrics-listen`, off by default; meant for a loopback or management address).
//!
//! One registry per process: an agent process is one node, and the counters are
//! process-wide by nature (the executor, the session and the checkpoint uploads all
//! count into it), so it is a `static` rather than a value threaded through every layer.
//! Labels are bounded: a GPU's index and UUID (the server's hardware), message types,
//! results. No job or attempt id is ever a label.

use commons_proto::{GpuInfo, GpuStat};
use http_body_util::Full;
use hyper::body::Bytes;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::LazyLock;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabels {
    pub gpu: u32,
    pub uuid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MessageLabels {
    pub direction: &'static str,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FateLabel {
    pub fate: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub gpu_utilization: Family<GpuLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub gpu_memory_used: Family<GpuLabels, Gauge>,
    pub gpu_memory_total: Family<GpuLabels, Gauge>,
    pub gpu_local_use: Family<GpuLabels, Gauge>,
    pub gpu_temperature: Family<GpuLabels, Gauge>,
    pub gpu_power: Family<GpuLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub gpu_ecc_uncorrected: Family<GpuLabels, Gauge>,
    pub container_starts: Counter,
    pub container_start_failures: Counter,
    pub lease_renewals: Counter,
    pub connected: Gauge,
    pub connections: Counter,
    pub messages: Family<MessageLabels, Counter>,
    pub checkpoint_uploads: Family<ResultLabel, Counter>,
    pub log_bytes: Family<FateLabel, Counter>,
}

/// This process's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

impl Metrics {
    fn new() -> Self {
        let mut r = Registry::with_prefix("commons_agent");
        let m = Metrics {
            registry: Registry::default(),
            gpu_utilization: Family::default(),
            gpu_memory_used: Family::default(),
            gpu_memory_total: Family::default(),
            gpu_local_use: Family::default(),
            gpu_temperature: Family::default(),
            gpu_power: Family::default(),
            gpu_ecc_uncorrected: Family::default(),
            container_starts: Counter::default(),
            container_start_failures: Counter::default(),
            lease_renewals: Counter::default(),
            connected: Gauge::default(),
            connections: Counter::default(),
            messages: Family::default(),
            checkpoint_uploads: Family::default(),
            log_bytes: Family::default(),
        };
        m.register_gpus(&mut r);
        m.register_agent(&mut r);
        Metrics { registry: r, ..m }
    }

    /// The GPUs' readings, one series per GPU.
    fn register_gpus(&self, r: &mut Registry) {
        r.register(
            "gpu_utilization_ratio",
            "GPU utilisation, 0 to 1, as the driver (or the fake GPU) reports it",
            self.gpu_utilization.clone(),
        );
        r.register(
            "gpu_memory_used_bytes",
            "GPU memory in use",
            self.gpu_memory_used.clone(),
        );
        r.register(
            "gpu_memory_total_bytes",
            "GPU memory",
            self.gpu_memory_total.clone(),
        );
        r.register(
            "gpu_local_use",
            "1 when a process GPU Commons did not start uses the GPU (the owner, directly)",
            self.gpu_local_use.clone(),
        );
        r.register(
            "gpu_temperature_celsius",
            "GPU temperature (NVML only; a MIG instance shows its GPU's)",
            self.gpu_temperature.clone(),
        );
        r.register(
            "gpu_power_watts",
            "GPU power draw (NVML only; a MIG instance shows its GPU's)",
            self.gpu_power.clone(),
        );
        r.register(
            "gpu_ecc_uncorrected_errors",
            "Uncorrected ECC errors since the driver loaded (NVML only); any withdraws the GPU",
            self.gpu_ecc_uncorrected.clone(),
        );
    }

    /// The agent's own work: containers, the portal link, messages, uploads, output.
    fn register_agent(&self, r: &mut Registry) {
        r.register(
            "container_starts",
            "Job containers created and started",
            self.container_starts.clone(),
        );
        r.register(
            "container_start_failures",
            "Job containers that could not be created or started",
            self.container_start_failures.clone(),
        );
        r.register(
            "lease_renewals",
            "Renew messages from the portal that extended this node's leases",
            self.lease_renewals.clone(),
        );
        r.register(
            "connected",
            "1 while the WebSocket to the portal is open",
            self.connected.clone(),
        );
        r.register(
            "connections",
            "WebSocket connections opened to the portal",
            self.connections.clone(),
        );
        r.register(
            "messages",
            "Protocol messages by direction (in: from the portal) and type",
            self.messages.clone(),
        );
        r.register(
            "checkpoint_uploads",
            "Checkpoint uploads by result (stored, nothing, refused, failed)",
            self.checkpoint_uploads.clone(),
        );
        r.register(
            "log_bytes",
            "Jobs' output by fate: sent to the portal, over_rate (over a job's --log-rate, \
         dropped), unsent (dropped while the portal was unreachable or slow)",
            self.log_bytes.clone(),
        );
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub fn message(&self, direction: &'static str, kind: &'static str) {
        self.messages
            .get_or_create(&MessageLabels { direction, kind })
            .inc();
    }

    /// Counts `n` bytes of jobs' output by what became of them.
    pub fn log_bytes(&self, fate: &'static str, n: usize) {
        self.log_bytes
            .get_or_create(&FateLabel { fate })
            .inc_by(n as u64);
    }

    pub fn checkpoint_upload(&self, result: &'static str) {
        self.checkpoint_uploads
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Records what only NVML reports: temperature, power and ECC errors.
    pub fn gpu_sensors(&self, views: &[crate::gpu::reading::GpuView]) {
        for v in views {
            let labels = GpuLabels {
                gpu: v.info.index,
                uuid: v.info.uuid.clone(),
            };
            if let Some(t) = v.temperature_c {
                self.gpu_temperature
                    .get_or_create(&labels)
                    .set(i64::from(t));
            }
            if let Some(w) = v.power_w {
                self.gpu_power.get_or_create(&labels).set(w);
            }
            if let Some(n) = v.ecc_uncorrected {
                self.gpu_ecc_uncorrected
                    .get_or_create(&labels)
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
    }

    /// Records the GPUs' latest figures.
    pub fn gpus(&self, inventory: &[GpuInfo], stats: &[GpuStat]) {
        for g in inventory {
            let labels = GpuLabels {
                gpu: g.index,
                uuid: g.uuid.clone(),
            };
            self.gpu_memory_total
                .get_or_create(&labels)
                .set((g.memory_mb * 1024 * 1024) as i64);
            if let Some(s) = stats.iter().find(|s| s.uuid == g.uuid) {
                self.gpu_utilization
                    .get_or_create(&labels)
                    .set(f64::from(s.utilization_pct) / 100.0);
                self.gpu_memory_used
                    .get_or_create(&labels)
                    .set((s.memory_used_mb * 1024 * 1024) as i64);
                self.gpu_local_use
                    .get_or_create(&labels)
                    .set(i64::from(s.local_use));
            }
        }
    }
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `GET /metrics` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener) {
    use hyper::{Request, Response, StatusCode};
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("metrics listener: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                    let res = if req.uri().path() == "/metrics" {
                        Response::builder()
                            .header("content-type", OPENMETRICS)
                            .body(Full::new(Bytes::from(METRICS.encode())))
                    } else {
                        Response::builder()
                            .status(StatusCode::NOT_FOUND)
                            .body(Full::new(Bytes::from_static(b"only /metrics here\n")))
                    };
                    res.map_err(|e| std::io::Error::other(e.to_string()))
                });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, svc)
                .await;
        });
    }
}
