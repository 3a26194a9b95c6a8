//! The agent's local control socket, `STATE_DIR/agent.sock` (mode 0660, group settable
//! with `--socket-group`), and its client, the `commons-agent status|lend|drain|undrain|
//! leave|reclaim` commands.
//!
//! One request per connection, JSON lines: the agent greets first ([`Greeting`]), so a
//! client can tell a socket that is not the agent's; the client sends a [`Request`]; the
//! agent answers a [`Reply`]. The agent learns who asks from the socket's peer
//! credentials (the local user named in the audit log), never from the request.

use commons_proto::control::{parse_window, LendWindow};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// The socket's name in the state dir.
pub const SOCKET_FILE: &str = "agent.sock";
/// What the agent's greeting says it is.
pub const AGENT_NAME: &str = "commons-agent";
/// Longest request line the agent reads.
pub const MAX_REQUEST: usize = 64 * 1024;

pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join(SOCKET_FILE)
}

/// The agent's first line on every connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Greeting {
    pub agent: String,
    pub node: String,
}

/// A command from the owner on the server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Status,
    Lend {
        mode: String,
        #[serde(default)]
        windows: Vec<LendWindow>,
    },
    Drain,
    Undrain,
    /// `on`: take every GPU back now; off: lend again under the rule.
    Reclaim {
        on: bool,
    },
    Leave,
}

/// The agent's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub ok: bool,
    pub message: String,
}

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("the agent is not running: no socket at {0} (start it with `commons-agent run`, or pass its --state-dir)")]
    NoSocket(PathBuf),
    #[error("the agent is not running: nobody listens on {0}")]
    NotListening(PathBuf),
    #[error("{0} is not the agent's socket ({1})")]
    NotAgent(PathBuf, String),
    #[error("permission denied on {0}: run as root or as a member of the socket's group (--socket-group)")]
    Denied(PathBuf),
    #[error("talking to the agent on {0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("{0}")]
    Usage(String),
}

/// Builds the `lend` request from the command line: `never`, `always`, or `windows`
/// followed by one or more windows (`"mon-fri 19:00-07:00"`).
pub fn lend_request(rule: &str, windows: &[String]) -> Result<Request, ClientError> {
    match rule {
        "never" | "always" if windows.is_empty() => Ok(Request::Lend {
            mode: rule.into(),
            windows: vec![],
        }),
        "never" | "always" => Err(ClientError::Usage(format!(
            "lend {rule} takes no windows (got {:?})",
            windows.join(" ")
        ))),
        "windows" if windows.is_empty() => Err(ClientError::Usage(
            "lend windows needs at least one window, e.g. lend windows \"mon-fri 19:00-07:00\" \"sat,sun 00:00-24:00\"".into(),
        )),
        "windows" => Ok(Request::Lend {
            mode: "windows".into(),
            windows: windows
                .iter()
                .map(|w| parse_window(w))
                .collect::<Result<_, _>>()
                .map_err(ClientError::Usage)?,
        }),
        other => Err(ClientError::Usage(format!(
            "unknown lending rule {other:?}: use never, always or windows"
        ))),
    }
}

/// Sends one request to the agent of `state_dir` and reads its reply. `wait` bounds the
/// wait for the reply (`leave` waits for the guests' grace).
pub fn call(state_dir: &Path, req: &Request, wait: Duration) -> Result<Reply, ClientError> {
    use std::os::unix::fs::FileTypeExt;
    let path = socket_path(state_dir);
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ClientError::NoSocket(path))
        }
        Err(e) => return Err(ClientError::Io(path, e)),
    };
    if !meta.file_type().is_socket() {
        return Err(ClientError::NotAgent(path, "not a socket".into()));
    }
    let stream = match std::os::unix::net::UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Err(ClientError::NotListening(path))
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(ClientError::Denied(path))
        }
        Err(e) => return Err(ClientError::Io(path, e)),
    };
    let io = |e| ClientError::Io(path.clone(), e);
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .map_err(io)?;
    let mut reader = BufReader::new(stream.try_clone().map_err(io)?);
    let mut line = String::new();
    let greeted = reader
        .by_ref()
        .take(4096)
        .read_line(&mut line)
        .ok()
        .and_then(|_| serde_json::from_str::<Greeting>(line.trim()).ok())
        .filter(|g| g.agent == AGENT_NAME);
    if greeted.is_none() {
        return Err(ClientError::NotAgent(
            path,
            "it did not greet as the agent does".into(),
        ));
    }
    let mut w = &stream;
    let mut text = serde_json::to_string(req).map_err(|e| io(std::io::Error::other(e)))?;
    text.push('\n');
    w.write_all(text.as_bytes()).map_err(io)?;
    stream.set_read_timeout(Some(wait)).map_err(io)?;
    line.clear();
    reader.take(16 << 20).read_line(&mut line).map_err(io)?;
    serde_json::from_str(line.trim()).map_err(|_| {
        ClientError::NotAgent(
            socket_path(state_dir),
            "its answer is not the agent's".into(),
        )
    })
}

/// The group named `name` from `/etc/group` text: its gid.
pub fn gid_of(group_file: &str, name: &str) -> Option<u32> {
    group_file.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then_some(())?;
        f.next()?;
        f.next()?.parse().ok()
    })
}

/// The user with `uid` from `/etc/passwd` text.
pub fn user_of(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        f.next()?;
        (f.next()?.parse::<u32>().ok()? == uid).then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lend_requests_are_checked_here() {
        assert_eq!(
            lend_request("never", &[]).unwrap(),
            Request::Lend {
                mode: "never".into(),
                windows: vec![]
            }
        );
        let Request::Lend { windows, .. } =
            lend_request("windows", &["mon-fri 19:00-07:00".into()]).unwrap()
        else {
            panic!()
        };
        assert_eq!(windows[0].days, vec![0, 1, 2, 3, 4]);
        for (rule, w, says) in [
            ("sometimes", vec![], "unknown lending rule \"sometimes\""),
            ("windows", vec![], "needs at least one window"),
            (
                "windows",
                vec!["weekdays 9-5".to_string()],
                "DAYS HH:MM-HH:MM",
            ),
            (
                "always",
                vec!["mon 10:00-11:00".to_string()],
                "takes no windows",
            ),
        ] {
            let e = lend_request(rule, &w).unwrap_err().to_string();
            assert!(e.contains(says), "{rule} {w:?}: {e}");
        }
    }

    #[test]
    fn users_and_groups_from_the_files() {
        let group = "root:x:0:\ndocker:x:998:alice\ncommons:x:1001:\n";
        assert_eq!(gid_of(group, "commons"), Some(1001));
        assert_eq!(gid_of(group, "nobody"), None);
        let passwd = "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\n";
        assert_eq!(user_of(passwd, 1000).as_deref(), Some("alice"));
        assert_eq!(user_of(passwd, 5), None);
    }

    #[test]
    fn a_missing_socket_or_a_foreign_one_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = call(dir.path(), &Request::Status, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, ClientError::NoSocket(_)), "{e}");
        assert!(e.to_string().contains("not running"));
        // A plain file where the socket should be.
        std::fs::write(socket_path(dir.path()), "x").unwrap();
        let e = call(dir.path(), &Request::Status, Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().contains("is not the agent's socket"), "{e}");
        // A socket that someone else serves.
        std::fs::remove_file(socket_path(dir.path())).unwrap();
        let l = std::os::unix::net::UnixListener::bind(socket_path(dir.path())).unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(b"220 smtp.example ESMTP\n").unwrap();
            std::thread::sleep(Duration::from_millis(200));
        });
        let e = call(dir.path(), &Request::Status, Duration::from_secs(1)).unwrap_err();
        assert!(
            matches!(e, ClientError::NotAgent(..)) && e.to_string().contains("did not greet"),
            "{e}"
        );
        t.join().unwrap();
        // A socket nobody listens on any more.
        let e = call(dir.path(), &Request::Status, Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().contains("not running"), "{e}");
    }
}
