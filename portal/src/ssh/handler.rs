//! One SSH connection: the login, and which requests are answered how. What flows on a
//! channel is `channel`'s business.

use super::channel;
use super::limit::{self, Limiter};
use crate::service::ssh::{self as uc, Login};
use crate::state::AppState;
use russh::server::{Auth, ChannelOpenHandle, Msg, PublicKeyOffer, Session, VerifiedPublicKey};
use russh::{Channel, ChannelId, Pty};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

pub struct Conn {
    state: AppState,
    peer: SocketAddr,
    limiter: Arc<Limiter>,
    login: Option<Login>,
    /// Key queries this connection made that were counted as failures: (user name, key).
    /// A login with one of them takes its failure back.
    queried: Vec<(String, russh::keys::ssh_key::public::KeyData)>,
}

/// The error type russh wants; the gateway's own failures are logged, then the
/// connection ends.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Ssh(#[from] russh::Error),
}

impl Conn {
    pub fn new(state: AppState, peer: SocketAddr, limiter: Arc<Limiter>) -> Self {
        Self {
            state,
            peer,
            limiter,
            login: None,
            queried: Vec::new(),
        }
    }

    /// Counts a failed login by `user` from this connection's address.
    fn failed(&self, user: &str) {
        let blocked = self.limiter.failure(self.peer.ip(), user, Instant::now());
        if blocked != limit::Blocked::No {
            tracing::warn!(peer = %self.peer, user, ?blocked, "SSH logins refused for a minute: too many failures");
        }
    }

    fn blocked(&self, user: &str) -> bool {
        let blocked = self.limiter.blocked(self.peer.ip(), user, Instant::now());
        if blocked {
            tracing::warn!(peer = %self.peer, user, "SSH login refused: too many failures from this address");
        }
        blocked
    }

    /// A key query ("would this key do?"), or the check before a signature is verified.
    /// It counts as a failure (taken back when this connection logs in with the key), and
    /// is answered by whether anyone registered the key, whichever job `user` names.
    async fn query(&mut self, user: &str, key: &russh::keys::PublicKey) -> Auth {
        if self.blocked(user) {
            return Auth::reject();
        }
        self.failed(user);
        self.queried
            .push((user.to_string(), key.key_data().clone()));
        match uc::key_registered(&self.state, key).await {
            Ok(known) => {
                tracing::info!(peer = %self.peer, user, known, "SSH key query");
                if known {
                    Auth::Accept
                } else {
                    Auth::reject()
                }
            }
            Err(e) => {
                tracing::error!(peer = %self.peer, user, "SSH key query failed: {e:#}");
                Auth::reject()
            }
        }
    }

    /// Takes back the failures the key queries for this login counted.
    fn forgive_queries(&mut self, user: &str, key: &russh::keys::PublicKey) {
        let data = key.key_data();
        let before = self.queried.len();
        self.queried.retain(|(u, k)| !(u == user && k == data));
        for _ in self.queried.len()..before {
            self.limiter.forgive(self.peer.ip(), user, Instant::now());
        }
    }

    fn login(&self) -> Option<Login> {
        self.login.clone()
    }
}

impl russh::server::Handler for Conn {
    type Error = GatewayError;

    async fn auth_none(&mut self, _user: &str) -> Result<Auth, Self::Error> {
        Ok(Auth::Reject {
            proceed_with_methods: Some(russh::MethodSet::from(&[russh::MethodKind::PublicKey][..])),
            partial_success: false,
        })
    }

    async fn auth_password(&mut self, user: &str, _password: &str) -> Result<Auth, Self::Error> {
        tracing::warn!(peer = %self.peer, user, "SSH password login refused (keys only)");
        self.failed(user);
        Ok(Auth::reject())
    }

    async fn auth_keyboard_interactive<'a>(
        &'a mut self,
        user: &str,
        _submethods: &str,
        _response: Option<russh::server::Response<'a>>,
    ) -> Result<Auth, Self::Error> {
        tracing::warn!(peer = %self.peer, user, "SSH keyboard-interactive login refused (keys only)");
        self.failed(user);
        Ok(Auth::reject())
    }

    async fn auth_publickey_offered(
        &mut self,
        user: &str,
        offer: PublicKeyOffer<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(self.query(user, offer.public_key).await)
    }

    /// After the signature was verified. Its failure was counted when the key was
    /// queried (russh asks [`Self::auth_publickey_offered`] first), so not again here.
    async fn auth_publickey(
        &mut self,
        user: &str,
        key: VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        if self.blocked(user) {
            return Ok(Auth::reject());
        }
        let from = self.peer.ip().to_string();
        match uc::authorize(&self.state, user, key.public_key, Some(from)).await {
            Ok(Ok(login)) => {
                tracing::info!(peer = %self.peer, user = %login.user.username, job = login.job, "SSH login");
                self.forgive_queries(user, key.public_key);
                self.login = Some(login);
                Ok(Auth::Accept)
            }
            Ok(Err(why)) => {
                tracing::warn!(peer = %self.peer, user, reason = ?why, "SSH login refused");
                Ok(Auth::reject())
            }
            Err(e) => {
                tracing::error!(peer = %self.peer, user, "SSH login check failed: {e:#}");
                Ok(Auth::reject())
            }
        }
    }

    async fn auth_openssh_certificate(
        &mut self,
        user: &str,
        _certificate: &russh::keys::Certificate,
    ) -> Result<Auth, Self::Error> {
        tracing::warn!(peer = %self.peer, user, "SSH certificate login refused (plain keys only)");
        Ok(Auth::reject())
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(login) = self.login() else {
            return Ok(());
        };
        reply.accept().await;
        tracing::debug!(step = "channel accepted", "SSH step");
        tokio::spawn(channel::session(self.state.clone(), login, channel));
        Ok(())
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host: &str,
        port: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(login) = self.login() else {
            return Ok(());
        };
        let port = match u16::try_from(port) {
            Ok(p) if p > 0 && is_loopback(host) => p,
            _ => {
                tracing::warn!(
                    job = login.job,
                    host,
                    port,
                    "SSH forward refused: only the container's own localhost"
                );
                reply
                    .reject(prohibited(
                        "GPU Commons forwards only to ports on the job container's localhost \
                         (e.g. -L 8888:localhost:8888)",
                    ))
                    .await;
                return Ok(());
            }
        };
        reply.accept().await;
        tokio::spawn(channel::forward(self.state.clone(), login, channel, port));
        Ok(())
    }

    async fn channel_open_x11(
        &mut self,
        _channel: Channel<Msg>,
        _originator_address: &str,
        _originator_port: u32,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        reply
            .reject(prohibited("X11 forwarding is not offered"))
            .await;
        Ok(())
    }

    async fn pty_request(
        &mut self,
        channel: ChannelId,
        _term: &str,
        _cols: u32,
        _rows: u32,
        _pix_width: u32,
        _pix_height: u32,
        _modes: &[(Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)?;
        Ok(())
    }

    async fn env_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        _value: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if channel::env_accepted(name) {
            session.channel_success(channel)?;
        } else {
            tracing::info!(name, "SSH env request refused");
            session.channel_failure(channel)?;
        }
        Ok(())
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)?;
        Ok(())
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        _data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)?;
        Ok(())
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if name == "sftp" {
            session.channel_success(channel)?;
        } else {
            tracing::info!(name, "SSH subsystem refused");
            session.channel_failure(channel)?;
        }
        Ok(())
    }

    async fn x11_request(
        &mut self,
        channel: ChannelId,
        _single_connection: bool,
        _x11_auth_protocol: &str,
        _x11_auth_cookie: &str,
        _x11_screen_number: u32,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_failure(channel)?;
        Ok(())
    }

    async fn agent_request(
        &mut self,
        channel: ChannelId,
        _session: &mut Session,
    ) -> Result<bool, Self::Error> {
        tracing::info!(?channel, "SSH agent forwarding refused");
        Ok(false)
    }

    async fn tcpip_forward(
        &mut self,
        address: &str,
        port: &mut u32,
        _session: &mut Session,
    ) -> Result<bool, Self::Error> {
        tracing::info!(address, port = *port, "SSH remote forwarding refused");
        Ok(false)
    }

    async fn streamlocal_forward(
        &mut self,
        _socket_path: &str,
        _session: &mut Session,
    ) -> Result<bool, Self::Error> {
        Ok(false)
    }
}

/// "Administratively prohibited", with words for the user (OpenSSH prints them).
fn prohibited(why: &str) -> russh::ChannelOpenFailure {
    russh::ChannelOpenFailure::Other {
        code: 1,
        reason: why.to_string(),
    }
}

/// The container's own loopback, as `-L` names it.
fn is_loopback(host: &str) -> bool {
    matches!(
        host,
        "localhost" | "127.0.0.1" | "::1" | "[::1]" | "ip6-localhost"
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn forwards_reach_only_the_containers_loopback() {
        assert!(super::is_loopback("localhost"));
        assert!(super::is_loopback("127.0.0.1"));
        assert!(!super::is_loopback("10.0.0.1"));
        assert!(!super::is_loopback("portal"));
    }
}
