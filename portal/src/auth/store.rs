//! The session store: browser sessions live in the database, the cookie carries only a
//! random 64-character key (encrypted by the session key, so it cannot be forged).
//!
//! Why not the cookie itself: a cookie that holds the whole session stays valid wherever
//! it is copied until its expiry, whatever logout does. With the state here, logging out
//! and an operator's "sign out everywhere" end the session for every copy of the cookie
//! at once, on every replica, and idle expiry is the server's clock, not the browser's.
//!
//! Sessions of visitors not signed in (a login page's CSRF token, the SSO flow's state)
//! live at most [`ANONYMOUS_TTL_S`], so anonymous requests cannot fill the table for the
//! whole idle period.

use super::SESSION_USER;
use crate::db::{web_sessions, Db};
use crate::error::AppError;
use actix_session::storage::{
    generate_session_key, LoadError, SaveError, SessionKey, SessionStore, UpdateError,
};
use actix_web::cookie::time::Duration;
use std::collections::HashMap;

/// The longest a session without a signed-in user is kept.
pub const ANONYMOUS_TTL_S: i64 = 3600;
/// A request moves the idle expiry only when that moves it by more than this.
const TOUCH_SLACK_S: i64 = 60;

#[derive(Clone)]
pub struct DbSessionStore {
    db: Db,
}

impl DbSessionStore {
    pub fn new(db: Db) -> Self {
        DbSessionStore { db }
    }
}

type State = HashMap<String, String>;

/// The signed-in user of a session's state (values are stored as JSON text).
fn user_of(state: &State) -> Option<i64> {
    state.get(SESSION_USER).and_then(|v| v.parse().ok())
}

fn ttl_for(state: &State, ttl: &Duration) -> i64 {
    let ttl = ttl.whole_seconds().max(1);
    if user_of(state).is_some() {
        ttl
    } else {
        ttl.min(ANONYMOUS_TTL_S)
    }
}

fn other(e: impl Into<AppError>) -> anyhow::Error {
    let e: AppError = e.into();
    anyhow::anyhow!("session store: {e}")
}

impl SessionStore for DbSessionStore {
    async fn load(&self, key: &SessionKey) -> Result<Option<State>, LoadError> {
        let key = key.as_ref().to_string();
        let row = self
            .db
            .run(move |c| web_sessions::load(c, &key))
            .await
            .map_err(|e| LoadError::Other(other(e)))?;
        match row {
            None => Ok(None),
            Some(r) => serde_json::from_str(&r.state)
                .map(Some)
                .map_err(|e| LoadError::Deserialization(e.into())),
        }
    }

    async fn save(&self, state: State, ttl: &Duration) -> Result<SessionKey, SaveError> {
        let json = serde_json::to_string(&state).map_err(|e| SaveError::Serialization(e.into()))?;
        let key = generate_session_key();
        let k = key.as_ref().to_string();
        let (user, ttl) = (user_of(&state), ttl_for(&state, ttl));
        self.db
            .run(move |c| web_sessions::insert(c, &k, user, &json, ttl))
            .await
            .map_err(|e| SaveError::Other(other(e)))?;
        Ok(key)
    }

    async fn update(
        &self,
        key: SessionKey,
        state: State,
        ttl: &Duration,
    ) -> Result<SessionKey, UpdateError> {
        let json =
            serde_json::to_string(&state).map_err(|e| UpdateError::Serialization(e.into()))?;
        let k = key.as_ref().to_string();
        let (user, secs) = (user_of(&state), ttl_for(&state, ttl));
        let j = json.clone();
        let updated = self
            .db
            .run(move |c| web_sessions::update(c, &k, user, &j, secs))
            .await
            .map_err(|e| UpdateError::Other(other(e)))?;
        if updated {
            return Ok(key);
        }
        // The session ended meanwhile (logged out elsewhere, expired): never bring it back
        // under the old key; the state goes into a new one.
        self.save(state, ttl).await.map_err(|e| match e {
            SaveError::Serialization(e) => UpdateError::Serialization(e),
            SaveError::Other(e) => UpdateError::Other(e),
        })
    }

    async fn update_ttl(&self, key: &SessionKey, ttl: &Duration) -> Result<(), anyhow::Error> {
        let k = key.as_ref().to_string();
        let secs = ttl.whole_seconds().max(1);
        // An anonymous session keeps its shorter life: touch never lengthens it past
        // what `save` gave.
        self.db
            .run(move |c| {
                web_sessions::touch(c, &k, secs, secs.min(ANONYMOUS_TTL_S), TOUCH_SLACK_S)
            })
            .await
            .map_err(other)
    }

    async fn delete(&self, key: &SessionKey) -> Result<(), anyhow::Error> {
        let k = key.as_ref().to_string();
        self.db
            .run(move |c| web_sessions::delete(c, &k))
            .await
            .map_err(other)
    }
}
