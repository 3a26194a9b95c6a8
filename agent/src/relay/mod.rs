//! SSH relays: the agent's end of a user's SSH channel into a job's container (the
//! protocol is in `commons_proto::relay`).
//!
//! For each `OpenRelay` the agent dials the relay WebSocket the portal named, with its node
//! credential and the one-time ticket, and connects it to the container through the
//! executor's `ContainerRuntime`: an exec (a shell, a command, the image's `sftp-server`) or, for `ssh -L`, a TCP connection made
//! inside the container's network namespace. Relays of an attempt end with a message for
//! the user when the agent stops the attempt ([`Relays::close_attempt`]); an exec ends by
//! itself when its container does.

mod exec;
mod forward;
pub mod signals;

use crate::executor::Executor;
use crate::runtime::ContainerRuntime;
use commons_proto::relay::{relay_ws_url, RelayCtl, RelayTarget};
use commons_proto::{Attempt, JobId, RelayOpen};
use futures_util::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;
type Key = (JobId, Attempt);
type Notices = HashMap<Key, Vec<(u64, watch::Sender<Option<String>>)>>;

/// The relays open on this agent, by attempt, so a stop can end them with its reason.
#[derive(Clone, Default)]
pub struct Relays {
    open: Arc<Mutex<Notices>>,
    next: Arc<AtomicU64>,
}

impl Relays {
    fn lock(&self) -> std::sync::MutexGuard<'_, Notices> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn register(&self, key: Key) -> (u64, watch::Receiver<Option<String>>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(None);
        self.lock().entry(key).or_default().push((id, tx));
        (id, rx)
    }

    fn unregister(&self, key: Key, id: u64) {
        let mut open = self.lock();
        if let Some(v) = open.get_mut(&key) {
            v.retain(|(i, _)| *i != id);
            if v.is_empty() {
                open.remove(&key);
            }
        }
    }

    /// Ends every relay of an attempt, telling its user `message`.
    pub fn close_attempt(&self, job: JobId, attempt: Attempt, message: &str) {
        if let Some(v) = self.lock().remove(&(job, attempt)) {
            for (_, tx) in v {
                let _ = tx.send(Some(message.to_string()));
            }
        }
    }

    /// How many relays are open (for logs and tests).
    pub fn count(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }
}

/// What a relay needs: where the portal is, the node's credential, the open relays (the
/// container runtime comes with the executor).
#[derive(Clone)]
pub struct RelayContext {
    pub portal: String,
    pub credential: String,
    pub relays: Relays,
}

/// Serves an `OpenRelay` in the background.
pub fn open<R: ContainerRuntime>(ctx: &RelayContext, exec: &Executor<R>, open: RelayOpen) {
    tracing::debug!(step = "OpenRelay received", "SSH step");
    let container = exec.running_container(open.job, open.attempt);
    let ctx = ctx.clone();
    let rt = exec.runtime();
    tokio::spawn(async move {
        let (job, attempt) = (open.job, open.attempt);
        if let Err(e) = serve(ctx, rt, open, container).await {
            tracing::warn!(job, attempt, "SSH relay failed: {e:#}");
        }
    });
}

async fn serve<R: ContainerRuntime>(
    ctx: RelayContext,
    rt: Arc<R>,
    open: RelayOpen,
    container: Result<String, String>,
) -> anyhow::Result<()> {
    // An exec's engine work (the job's environment, the exec's creation) overlaps the
    // dial: both are on the way to the first output.
    let exec_cmd = match &open.target {
        RelayTarget::Exec { command, tty, env } => {
            let cmd = match command {
                Some(c) => vec!["/bin/sh".to_string(), "-c".to_string(), c.clone()],
                None => login_shell(),
            };
            Some((cmd, tty.clone(), env.clone()))
        }
        RelayTarget::Sftp => Some((sftp_server(), None, Default::default())),
        RelayTarget::Forward { .. } => None,
    };
    let prepare = async {
        match (&container, exec_cmd) {
            (Ok(c), Some((cmd, tty, env))) => Some(exec::prepare(&*rt, c, cmd, tty, env).await),
            _ => None,
        }
    };
    let (ws, prepared) = tokio::join!(dial(&ctx, &open), prepare);
    let ws = ws?;
    let container = match container {
        Ok(c) => c,
        Err(message) => return close(ws, message).await,
    };
    let key = (open.job, open.attempt);
    let (id, closed) = ctx.relays.register(key);
    tracing::info!(job = open.job, attempt = open.attempt, target = ?open.target, "SSH relay open");
    let result = match (open.target, prepared) {
        (RelayTarget::Forward { port }, _) => {
            forward::run(&*rt, &container, open.job, port, ws, closed).await
        }
        (_, Some(prepared)) => exec::run(rt, prepared, ws, closed).await,
        (_, None) => Ok(()),
    };
    ctx.relays.unregister(key, id);
    tracing::info!(job = open.job, attempt = open.attempt, "SSH relay closed");
    result
}

/// Dials the relay WebSocket the portal named, with the node's credential.
async fn dial(ctx: &RelayContext, open: &RelayOpen) -> anyhow::Result<Ws> {
    let base = open.relay_url.as_deref().unwrap_or(&ctx.portal);
    let mut req = relay_ws_url(base, &open.ticket).into_client_request()?;
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", ctx.credential).parse()?,
    );
    // No Nagle: a relay's small frames (a prompt, an exit status, an SFTP reply) go out
    // at once instead of waiting for the previous frame's acknowledgement.
    let (ws, _) = tokio_tungstenite::connect_async_with_config(req, None, true).await?;
    tracing::debug!(step = "relay dialled", "SSH step");
    Ok(ws)
}

/// Says why the relay ends and closes it.
async fn close(ws: Ws, message: String) -> anyhow::Result<()> {
    let (mut sink, mut stream) = ws.split();
    send_ctl(&mut sink, &RelayCtl::Closed { message }).await?;
    let reader = tokio::spawn(async move {
        while !matches!(next_incoming(&mut stream).await, Incoming::Gone) {}
    });
    finish(sink, reader).await;
    Ok(())
}

/// How long a finished relay waits for the portal to close its side.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Ends a relay the WebSocket way: our Close frame, then the portal's, which `reader` (the
/// task reading the relay) sees as the end. Dropping the connection at once instead could
/// lose the last frames still unread on the portal's side.
async fn finish(
    mut sink: futures_util::stream::SplitSink<Ws, Message>,
    reader: tokio::task::JoinHandle<()>,
) {
    let _ = sink.close().await;
    let abort = reader.abort_handle();
    if tokio::time::timeout(CLOSE_WAIT, reader).await.is_err() {
        abort.abort();
    }
}

async fn send_ctl<S>(ws: &mut S, ctl: &RelayCtl) -> anyhow::Result<()>
where
    S: futures_util::Sink<Message, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
{
    ws.send(Message::text(serde_json::to_string(ctl)?)).await?;
    Ok(())
}

/// What arrived from the portal on a relay.
enum Incoming {
    Data(bytes::Bytes),
    Ctl(RelayCtl),
    /// The portal closed the relay (the user closed the channel).
    Gone,
}

async fn next_incoming<S>(stream: &mut S) -> Incoming
where
    S: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    loop {
        match stream.next().await {
            Some(Ok(Message::Binary(b))) => return Incoming::Data(b),
            Some(Ok(Message::Text(t))) => match serde_json::from_str::<RelayCtl>(&t) {
                Ok(c) => return Incoming::Ctl(c),
                Err(e) => tracing::warn!("ignoring a relay message this agent does not know: {e}"),
            },
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return Incoming::Gone,
            Some(Ok(_)) => {}
        }
    }
}

/// A login shell: bash where the image has it, sh otherwise.
fn login_shell() -> Vec<String> {
    vec![
        "/bin/sh".into(),
        "-c".into(),
        "if [ -x /bin/bash ]; then exec /bin/bash -l; fi; exec /bin/sh -l".into(),
    ]
}

/// The image's own `sftp-server`, wherever the distribution put it.
fn sftp_server() -> Vec<String> {
    vec![
        "/bin/sh".into(),
        "-c".into(),
        "for p in /usr/lib/openssh/sftp-server /usr/lib/sftp-server /usr/libexec/openssh/sftp-server \
         /usr/libexec/sftp-server /usr/lib/ssh/sftp-server; do [ -x \"$p\" ] && exec \"$p\"; done; \
         echo 'GPU Commons: this job'\"'\"'s image has no sftp-server, so scp and sftp cannot work; \
         install openssh-sftp-server (Debian/Ubuntu) or openssh-server in the image' >&2; exit 127"
            .into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_ends_the_attempts_relays_only() {
        let r = Relays::default();
        let (_a, rx_a) = r.register((1, 1));
        let (_b, rx_b) = r.register((2, 1));
        r.close_attempt(1, 1, "job 1 was cancelled");
        assert_eq!(rx_a.borrow().as_deref(), Some("job 1 was cancelled"));
        assert_eq!(*rx_b.borrow(), None);
        assert_eq!(r.count(), 1);
    }
}
