//! One SSH connection: the login, and which requests are answered how. What flows on a
//! channel is `channel`'s business.

use super::channel;
use super::limit::Limiter;
use crate::service::ssh::{self as uc, Login, Refusal};
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
        }
    }

    async fn check(&self, user: &str, key: &russh::keys::PublicKey, verified: bool) -> Auth {
        if self.limiter.blocked(self.peer.ip(), Instant::now()) {
            tracing::warn!(peer = %self.peer, user, "SSH login refused: too many failures from this address");
            return Auth::reject();
        }
        match uc::authorize(&self.state, user, key, verified).await {
            Ok(Ok(_)) => Auth::Accept,
            Ok(Err(why)) => {
                if verified {
                    self.refused(user, &why);
                }
                Auth::reject()
            }
            Err(e) => {
                tracing::error!(peer = %self.peer, user, "SSH login check failed: {e:#}");
                Auth::reject()
            }
        }
    }

    fn refused(&self, user: &str, why: &Refusal) {
        let blocked = self.limiter.failure(self.peer.ip(), Instant::now());
        tracing::warn!(peer = %self.peer, user, reason = ?why, blocked, "SSH login refused");
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
        self.limiter.failure(self.peer.ip(), Instant::now());
        Ok(Auth::reject())
    }

    async fn auth_keyboard_interactive<'a>(
        &'a mut self,
        user: &str,
        _submethods: &str,
        _response: Option<russh::server::Response<'a>>,
    ) -> Result<Auth, Self::Error> {
        tracing::warn!(peer = %self.peer, user, "SSH keyboard-interactive login refused (keys only)");
        self.limiter.failure(self.peer.ip(), Instant::now());
        Ok(Auth::reject())
    }

    async fn auth_publickey_offered(
        &mut self,
        user: &str,
        offer: PublicKeyOffer<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(self.check(user, offer.public_key, false).await)
    }

    async fn auth_publickey(
        &mut self,
        user: &str,
        key: VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        if self.limiter.blocked(self.peer.ip(), Instant::now()) {
            return Ok(Auth::reject());
        }
        match uc::authorize(&self.state, user, key.public_key, true).await {
            Ok(Ok(login)) => {
                tracing::info!(peer = %self.peer, user = %login.user.username, job = login.job, "SSH login");
                let from = self.peer.ip().to_string();
                if let Err(e) = uc::audit_login(&self.state, &login, &from).await {
                    tracing::error!("SSH login not audited, so refused: {e:#}");
                    return Ok(Auth::reject());
                }
                self.login = Some(login);
                Ok(Auth::Accept)
            }
            Ok(Err(why)) => {
                self.refused(user, &why);
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
