//! SSH relays: how a user's SSH channel reaches a job's container.
//!
//! The portal's SSH gateway terminates SSH; each channel that needs the container (a shell,
//! a command, sftp, a `-L` forward) becomes one *relay*: the portal sends the agent
//! [`PortalMsg::OpenRelay`](crate::PortalMsg::OpenRelay) with a one-time ticket on the
//! agent's control WebSocket, and the agent dials a second WebSocket,
//! `GET {relay_url}{RELAY_PATH}/{ticket}` with its node credential, that carries only this
//! channel's bytes. Bulk data (an `scp` of a checkpoint) so never waits behind, or delays,
//! the control connection's heartbeats and leases, and each relay has TCP's own flow
//! control.
//!
//! On the relay WebSocket:
//! - binary frames portal -> agent are the channel's input (stdin, or the forwarded
//!   connection's bytes);
//! - binary frames agent -> portal start with one [`Stream`] byte, then the output;
//! - text frames both ways are JSON [`RelayCtl`] messages (resize, signal, end of input;
//!   the exit status, or why the relay closed).
//!
//! A ticket is good for one dial, within [`RELAY_DIAL_TIMEOUT_S`], by the node that holds
//! the attempt. The portal replica that holds the user's SSH connection issues it and names
//! itself in `relay_url`, so the relay works whichever replica holds the agent's control
//! connection.

use crate::{Attempt, JobId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The agent dials `{relay_url}{RELAY_PATH}/{ticket}` (WebSocket, node credential).
pub const RELAY_PATH: &str = "/api/agent/v1/relay";
/// A ticket nobody dialled within this long is void.
pub const RELAY_DIAL_TIMEOUT_S: u64 = 15;
/// The largest binary frame either side sends.
pub const RELAY_CHUNK_BYTES: usize = 32 * 1024;

/// Where a relay's output byte belongs (the first byte of an agent -> portal frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Stream {
    Stdout = 1,
    Stderr = 2,
}

impl Stream {
    pub fn from_byte(b: u8) -> Option<Stream> {
        match b {
            1 => Some(Stream::Stdout),
            2 => Some(Stream::Stderr),
            _ => None,
        }
    }
}

/// A terminal, as the SSH client asked for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tty {
    pub term: String,
    pub cols: u16,
    pub rows: u16,
}

/// What a relay connects to inside the job's container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum RelayTarget {
    /// A process in the container, as the container's user: `command` through `/bin/sh -c`,
    /// or a login shell when there is none.
    Exec {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        command: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tty: Option<Tty>,
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
    /// The image's `sftp-server` (scp and sftp use it).
    Sftp,
    /// A TCP connection to `port` on the container's own loopback (`ssh -L`).
    Forward { port: u16 },
}

/// Control messages on a relay (text frames).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RelayCtl {
    /// Portal -> agent: the terminal's new size.
    Resize { cols: u16, rows: u16 },
    /// Portal -> agent: a signal for the process, by its SSH name without `SIG` ("INT").
    Signal { name: String },
    /// Portal -> agent: no more input.
    Eof,
    /// Agent -> portal: the process ended with this status.
    Exit { code: i64 },
    /// Agent -> portal: the relay ends without an exit status, with words for the user
    /// ("job 42 was cancelled", "this image has no sftp-server").
    Closed { message: String },
}

/// The signals a relay passes on; others are refused (the SSH names of RFC 4254 6.10).
pub fn signal_number(name: &str) -> Option<i32> {
    Some(match name {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "KILL" => 9,
        "USR1" => 10,
        "USR2" => 12,
        "TERM" => 15,
        _ => return None,
    })
}

/// Whether an SSH client may set environment variable `name` in a relay's process: a
/// well-formed name (letters, digits, `_`, not starting with a digit), and none of what
/// selects GPUs or their shares (`CUDA_MPS_*` carries a share's limits), loads code into
/// every process, or is GPU Commons' own (the agent alone decides those). `TERM` comes
/// from the terminal request. The agent also drops any variable the job's environment
/// already sets, so a session never runs with other values than the job's.
pub fn env_allowed(name: &str) -> bool {
    let well_formed = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .enumerate()
            .all(|(i, c)| c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()));
    well_formed
        && !name.starts_with("NVIDIA_")
        && !name.starts_with("LD_")
        && !name.starts_with("COMMONS_")
        && !name.starts_with("CUDA_MPS_")
        && name != "CUDA_VISIBLE_DEVICES"
        && name != "TERM"
}

/// The job and attempt a relay belongs to, with its ticket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayOpen {
    pub ticket: String,
    pub job: JobId,
    pub attempt: Attempt,
    /// The portal replica to dial (its base URL); none: the portal the agent talks to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_url: Option<String>,
    pub target: RelayTarget,
}

/// The relay WebSocket's URL for a portal base URL (`http` becomes `ws`).
pub fn relay_ws_url(base: &str, ticket: &str) -> String {
    let base = base.trim_end_matches('/');
    let base = if let Some(rest) = base.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = base.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        base.to_string()
    };
    format!("{base}{RELAY_PATH}/{ticket}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_controls_are_tagged_json() {
        let t = RelayTarget::Exec {
            command: Some("echo hi".into()),
            tty: None,
            env: BTreeMap::new(),
        };
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(text, r#"{"kind":"exec","command":"echo hi","env":{}}"#);
        assert_eq!(serde_json::from_str::<RelayTarget>(&text).unwrap(), t);
        let f: RelayTarget = serde_json::from_str(r#"{"kind":"forward","port":8888}"#).unwrap();
        assert_eq!(f, RelayTarget::Forward { port: 8888 });
        assert!(serde_json::from_str::<RelayTarget>(r#"{"kind":"forward","port":70000}"#).is_err());
        let c = RelayCtl::Exit { code: 7 };
        assert_eq!(
            serde_json::to_string(&c).unwrap(),
            r#"{"type":"exit","code":7}"#
        );
        assert!(serde_json::from_str::<RelayCtl>(r#"{"type":"exit","code":7,"x":1}"#).is_err());
    }

    #[test]
    fn relay_urls_follow_the_scheme() {
        assert_eq!(
            relay_ws_url("https://gpu.campus.edu/", "ab"),
            "wss://gpu.campus.edu/api/agent/v1/relay/ab"
        );
        assert_eq!(
            relay_ws_url("http://10.0.0.1:8080", "ab"),
            "ws://10.0.0.1:8080/api/agent/v1/relay/ab"
        );
    }

    #[test]
    fn gpu_selection_and_loader_variables_are_refused() {
        for bad in [
            "NVIDIA_VISIBLE_DEVICES",
            "CUDA_VISIBLE_DEVICES",
            "LD_PRELOAD",
            "COMMONS_RESUME",
            "1ABC",
            "A B",
            "",
            "A=B",
        ] {
            assert!(!env_allowed(bad), "{bad:?}");
        }
        for good in ["LANG", "LC_ALL", "MY_VAR2", "_X"] {
            assert!(env_allowed(good), "{good:?}");
        }
    }

    #[test]
    fn only_known_signals_pass() {
        assert_eq!(signal_number("INT"), Some(2));
        assert_eq!(signal_number("TERM"), Some(15));
        assert_eq!(signal_number("SEGV"), None);
        assert_eq!(Stream::from_byte(2), Some(Stream::Stderr));
        assert_eq!(Stream::from_byte(0), None);
    }
}
