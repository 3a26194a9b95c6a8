//! The SSH gateway: `ssh -p 2222 job-42@portal` reaches job 42's container, with plain
//! OpenSSH, scp/sftp, `-L` forwarding and VS Code Remote-SSH, and without an sshd in the
//! image.
//!
//! The gateway terminates SSH here (russh) and checks the login against the job owner's
//! keys (`service::ssh`); each channel that needs the container becomes a relay through
//! the job's agent (`service::relays`, `commons_proto::relay`), which runs `docker exec`
//! or connects inside the container's network namespace. Agents dial out for relays as
//! they do for everything, so lab servers need no inbound port.
//!
//! - One host key per deployment: a file (made at first start, mode 0600) that replicas
//!   share; its public half is recorded in the database, and a replica whose file holds
//!   another key refuses to start its gateway rather than make users face "host key
//!   changed".
//! - Per source address: connections per minute; failed logins per minute per address
//!   and user name, and a higher cap per address ([`limit`]). A key query counts as a
//!   failed login and says the same for every job ([`handler`]).
//! - Refused: passwords, keyboard-interactive, remote (`-R`) and agent forwarding, X11.

mod channel;
mod handler;
pub mod limit;
mod quickack;

use crate::state::AppState;
use anyhow::Context;
use russh::keys::ssh_key::private::{Ed25519Keypair, KeypairData};
use russh::keys::ssh_key::LineEnding;
use russh::keys::{HashAlg, PrivateKey};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many bytes a client may send on a channel before the gateway has read them.
const WINDOW_BYTES: u32 = 8 * 1024 * 1024;
/// The largest SSH packet a client may send (russh warns above 65,535).
const MAX_PACKET_BYTES: u32 = 65_535;

/// The ciphers named, in russh's names, for the gateway's offer: an error names one this
/// gateway cannot speak (or `none`), or an empty list.
pub fn ciphers(names: &[String]) -> Result<Vec<russh::cipher::Name>, String> {
    if names.is_empty() {
        return Err("offer at least one cipher, e.g. aes256-gcm@openssh.com".into());
    }
    names
        .iter()
        .map(|n| match russh::cipher::Name::try_from(n.as_str()) {
            Ok(c) if encrypts(&c) => Ok(c),
            _ => Err(format!(
                "{n:?} is not a cipher the gateway speaks (it speaks {})",
                spoken().join(", ")
            )),
        })
        .collect()
}

/// A cipher that encrypts: every one russh speaks but `none` and its alias `clear`.
fn encrypts(c: &russh::cipher::Name) -> bool {
    *c != russh::cipher::NONE && *c != russh::cipher::CLEAR
}

fn spoken() -> Vec<&'static str> {
    russh::cipher::ALL_CIPHERS
        .iter()
        .filter(|c| encrypts(c))
        .map(|c| c.as_ref())
        .collect()
}

/// A started gateway.
pub struct Gateway {
    pub addr: SocketAddr,
    /// The host public key, OpenSSH one-line form.
    pub host_key: String,
    pub task: tokio::task::JoinHandle<()>,
}

/// The host key users see, as job pages show it: the public key line and its SHA-256
/// fingerprint.
#[derive(Debug, Clone)]
pub struct HostKey {
    pub public_key: String,
    pub fingerprint: String,
}

impl HostKey {
    pub fn from_openssh(line: &str) -> Option<HostKey> {
        let key = russh::keys::PublicKey::from_openssh(line).ok()?;
        Some(HostKey {
            public_key: key.to_openssh().ok()?,
            fingerprint: key.fingerprint(HashAlg::Sha256).to_string(),
        })
    }
}

/// Reads the host key, making one (ed25519, mode 0600) when the file does not exist.
pub fn load_or_create_host_key(path: &Path) -> anyhow::Result<PrivateKey> {
    if path.exists() {
        return PrivateKey::read_openssh_file(path)
            .with_context(|| format!("cannot read the SSH host key {}", path.display()));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let seed: [u8; 32] = rand::random();
    let key = PrivateKey::new(
        KeypairData::Ed25519(Ed25519Keypair::from_seed(&seed)),
        "gpu-commons gateway",
    )?;
    let pem = key.to_openssh(LineEnding::LF)?;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create the SSH host key {}", path.display()))?;
    f.write_all(pem.as_bytes())?;
    f.sync_all()?;
    tracing::info!(path = %path.display(), "made a new SSH host key");
    Ok(key)
}

/// Starts the gateway when `[ssh] listen` is set.
pub async fn start(state: AppState) -> anyhow::Result<Option<Gateway>> {
    let Some(listen) = state.config.ssh.listen.clone() else {
        return Ok(None);
    };
    let path = state.config.ssh.host_key_path(&state.config.database_url);
    let key = tokio::task::spawn_blocking(move || load_or_create_host_key(&path)).await??;
    let public = key.public_key().to_openssh()?;
    let algorithm = key.algorithm().to_string();
    let mine = public.clone();
    let recorded = crate::service::ssh::claim_host_key(&state, algorithm, mine).await?;
    let same = |a: &str, b: &str| {
        a.split_whitespace()
            .take(2)
            .eq(b.split_whitespace().take(2))
    };
    anyhow::ensure!(
        same(&recorded, &public),
        "this replica's SSH host key ({}) is not the deployment's ({}): give every replica \
         the same host_key_file",
        key.public_key().fingerprint(HashAlg::Sha256),
        HostKey::from_openssh(&recorded)
            .map(|k| k.fingerprint)
            .unwrap_or_else(|| "unreadable".into()),
    );
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .with_context(|| format!("cannot listen for SSH on {listen}"))?;
    let addr = listener.local_addr()?;
    let config = Arc::new(russh::server::Config {
        server_id: russh::SshId::Standard("SSH-2.0-GPUCommons".into()),
        methods: russh::MethodSet::from(&[russh::MethodKind::PublicKey][..]),
        auth_rejection_time: Duration::from_millis(500),
        // OpenSSH first asks with "none" to learn the methods: answer at once.
        auth_rejection_time_initial: Some(Duration::ZERO),
        keys: vec![key],
        max_auth_attempts: 6,
        // Interactive shells sit idle for hours; dead peers are found by keepalives.
        inactivity_timeout: None,
        keepalive_interval: Some(Duration::from_secs(30)),
        keepalive_max: 4,
        nodelay: true,
        // What a client may send ahead (an upload: scp's 64 outstanding writes of 32 KiB
        // fill 2 MiB, so a larger window never stalls it), and in packets of up to 64 KiB
        // (an SFTP write of 32 KiB and its header fit in one).
        window_size: WINDOW_BYTES,
        maximum_packet_size: MAX_PACKET_BYTES,
        preferred: russh::Preferred {
            cipher: std::borrow::Cow::Owned(
                ciphers(&state.config.ssh.ciphers).map_err(anyhow::Error::msg)?,
            ),
            ..russh::Preferred::DEFAULT
        },
        ..Default::default()
    });
    let limiter = Arc::new(limit::Limiter::new(
        state.config.ssh.connections_per_minute,
        state.config.ssh.auth_failures_per_minute,
        state.config.ssh.auth_failures_per_address_per_minute,
    ));
    tracing::info!(%addr, "SSH gateway listening");
    let task = tokio::spawn(accept_loop(state, listener, config, limiter));
    Ok(Some(Gateway {
        addr,
        host_key: public,
        task,
    }))
}

async fn accept_loop(
    state: AppState,
    listener: tokio::net::TcpListener,
    config: Arc<russh::server::Config>,
    limiter: Arc<limit::Limiter>,
) {
    loop {
        let (socket, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("SSH accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        match limiter.connection(peer.ip(), Instant::now()) {
            limit::Verdict::Allow => {}
            verdict => {
                tracing::warn!(%peer, ?verdict, "SSH connection refused by the rate limit");
                drop(socket);
                continue;
            }
        }
        let _ = socket.set_nodelay(true);
        tracing::debug!(%peer, step = "accepted", "SSH step");
        let handler = handler::Conn::new(state.clone(), peer, limiter.clone());
        let config = config.clone();
        tokio::spawn(async move {
            let socket = quickack::QuickAck::new(socket);
            match russh::server::run_stream(config, socket, handler).await {
                Ok(session) => {
                    if let Err(e) = session.await {
                        tracing::warn!(%peer, "SSH session ended: {e:?}");
                    }
                }
                Err(e) => tracing::debug!(%peer, "SSH handshake failed: {e}"),
            }
        });
    }
}
