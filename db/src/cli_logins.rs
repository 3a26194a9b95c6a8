//! Pending browser sign-ins of the `commons` CLI (the device authorization grant): made
//! by the CLI, decided by a signed-in user, redeemed once by the CLI.
//!
//! Invariants: the device code is stored hashed; a row is decided at most once, only
//! before it expires; it is redeemed at most once (a conditional update), so one
//! approval gives one token however often or from wherever the CLI polls. A row lives
//! until it expires whatever becomes of it, so the rows of an address are the sign-ins it
//! started in the last [`TTL_S`] seconds (what the per-address limit counts). A poll that
//! comes sooner than `interval_s` after the previous one is answered `slow_down` and adds
//! [`SLOW_DOWN_S`] to the interval (RFC 8628 section 3.5).

use super::schema::cli_logins;
use super::users::{hash_secret, new_secret};
use super::DbError;
use super::{now, DbConn};
use chrono::{Duration, NaiveDateTime};
use diesel::prelude::*;

/// How long a sign-in may wait for its user.
pub const TTL_S: i64 = 600;
/// The most sign-ins waiting at once (the start endpoint needs no login).
const MAX_PENDING: i64 = 10_000;
/// The poll interval a sign-in starts with, in seconds.
pub const INTERVAL_S: i64 = 2;
/// What a poll that comes too early adds to the interval.
pub const SLOW_DOWN_S: i64 = 5;
/// How much earlier than the interval a poll may come without being too early: replicas'
/// clocks and the network are not exact.
const EARLY_SLACK_MS: i64 = 500;
/// User codes use consonants only (no vowels: no words; no look-alikes such as 0/O, 1/I).
const ALPHABET: &[u8] = b"BCDFGHJKLMNPQRSTVWXZ";

#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = cli_logins)]
pub struct CliLogin {
    pub id: i64,
    pub user_code: String,
    pub client_name: String,
    pub created_at: NaiveDateTime,
    pub expires_at: NaiveDateTime,
    pub user_id: Option<i64>,
    pub approved_at: Option<NaiveDateTime>,
    pub denied_at: Option<NaiveDateTime>,
    pub redeemed_at: Option<NaiveDateTime>,
    pub client_addr: String,
    pub interval_s: i64,
    pub last_polled_at: Option<NaiveDateTime>,
    pub can_add_credentials: bool,
}

impl CliLogin {
    pub fn decided(&self) -> bool {
        self.approved_at.is_some() || self.denied_at.is_some()
    }
}

/// `ABCD-EFGH` as shown; what users type is normalised by [`normalise_user_code`].
fn new_user_code() -> String {
    let mut s = String::with_capacity(9);
    for i in 0..8 {
        if i == 4 {
            s.push('-');
        }
        let k = rand::random_range(0..ALPHABET.len());
        s.push(char::from(ALPHABET[k]));
    }
    s
}

/// Upper case, with the dash where it belongs; spaces and dashes typed are ignored.
pub fn normalise_user_code(typed: &str) -> String {
    let plain: String = typed
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_uppercase())
        .collect();
    if plain.len() == 8 {
        format!("{}-{}", &plain[..4], &plain[4..])
    } else {
        plain
    }
}

/// Starts a sign-in for `client_name` from `client_addr`, unless that address started
/// `per_address` or more in the last [`TTL_S`] seconds; returns (device code, user code,
/// expiry).
pub fn start(
    c: &mut DbConn,
    client_name: &str,
    client_addr: &str,
    per_address: u32,
) -> Result<(String, String, NaiveDateTime), DbError> {
    let t = now();
    diesel::delete(cli_logins::table.filter(cli_logins::expires_at.lt(t))).execute(c)?;
    let from_here: i64 = cli_logins::table
        .filter(cli_logins::client_addr.eq(client_addr))
        .count()
        .get_result(c)?;
    if from_here >= i64::from(per_address) {
        let oldest: Option<NaiveDateTime> = cli_logins::table
            .filter(cli_logins::client_addr.eq(client_addr))
            .select(diesel::dsl::min(cli_logins::expires_at))
            .first(c)?;
        let wait = oldest.map_or(TTL_S, |o| (o - t).num_seconds().clamp(1, TTL_S));
        return Err(DbError::TooMany {
            code: "too_many_sign_ins",
            message: format!(
                "{client_addr} started {from_here} sign-ins in the last {} minutes, the most \
                 one address may; try again in {} s",
                TTL_S / 60,
                wait
            ),
            retry_after_s: u64::try_from(wait).unwrap_or(1),
        });
    }
    let pending: i64 = cli_logins::table.count().get_result(c)?;
    if pending >= MAX_PENDING {
        return Err(DbError::Full(
            "too many sign-ins are waiting; try again in a few minutes".into(),
        ));
    }
    let device_code = new_secret("gcd");
    let expires = t + Duration::seconds(TTL_S);
    // A clash of user codes (one in 25 billion per pending row) is retried.
    for _ in 0..5 {
        let user_code = new_user_code();
        let inserted = diesel::insert_into(cli_logins::table)
            .values((
                cli_logins::device_code_hash.eq(hash_secret(&device_code)),
                cli_logins::user_code.eq(&user_code),
                cli_logins::client_name.eq(client_name),
                cli_logins::created_at.eq(t),
                cli_logins::expires_at.eq(expires),
                cli_logins::client_addr.eq(client_addr),
                cli_logins::interval_s.eq(INTERVAL_S),
            ))
            .execute(c);
        match inserted {
            Ok(_) => return Ok((device_code, user_code, expires)),
            Err(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::UniqueViolation,
                _,
            )) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(DbError::Internal("no free user code after 5 tries".into()))
}

/// The sign-in a user code names, if it has not expired.
pub fn by_user_code(c: &mut DbConn, typed: &str) -> Result<Option<CliLogin>, DbError> {
    Ok(cli_logins::table
        .filter(cli_logins::user_code.eq(normalise_user_code(typed)))
        .filter(cli_logins::expires_at.gt(now()))
        .select(CliLogin::as_select())
        .first(c)
        .optional()?)
}

/// Approves (`Some(may add credentials)`) or denies (`None`) sign-in `id` for `user`;
/// false when it was decided already or has expired.
pub fn decide(c: &mut DbConn, id: i64, user: i64, approve: Option<bool>) -> Result<bool, DbError> {
    let t = now();
    let open = cli_logins::table
        .find(id)
        .filter(cli_logins::approved_at.is_null())
        .filter(cli_logins::denied_at.is_null())
        .filter(cli_logins::expires_at.gt(t));
    let n = if let Some(credentials) = approve {
        diesel::update(open)
            .set((
                cli_logins::user_id.eq(user),
                cli_logins::approved_at.eq(t),
                cli_logins::can_add_credentials.eq(credentials),
            ))
            .execute(c)?
    } else {
        diesel::update(open)
            .set((cli_logins::user_id.eq(user), cli_logins::denied_at.eq(t)))
            .execute(c)?
    };
    Ok(n == 1)
}

/// Where a device code stands when the CLI polls.
#[derive(Debug, Clone, PartialEq)]
pub enum Poll {
    /// No such code (never made, or removed after expiry).
    Unknown,
    Expired,
    Pending,
    Denied,
    /// Already redeemed: a second poll gets nothing.
    Spent,
    /// Too soon after the previous poll: the interval is now this many seconds.
    SlowDown(i64),
    /// Approved, and redeemed by this call.
    Approved(Approved),
}

/// What an approved sign-in grants.
#[derive(Debug, Clone, PartialEq)]
pub struct Approved {
    pub user: i64,
    pub client_name: String,
    pub client_addr: String,
    pub can_add_credentials: bool,
}

/// Polls the sign-in of `device_code`; redeems it when approved (once).
pub fn poll(c: &mut DbConn, device_code: &str) -> Result<Poll, DbError> {
    let hash = hash_secret(device_code);
    let row: Option<CliLogin> = cli_logins::table
        .filter(cli_logins::device_code_hash.eq(&hash))
        .select(CliLogin::as_select())
        .first(c)
        .optional()?;
    let Some(row) = row else {
        return Ok(Poll::Unknown);
    };
    let t = now();
    if row.redeemed_at.is_some() {
        return Ok(Poll::Spent);
    }
    // Pacing first: a client that polls too fast learns nothing else until it slows down.
    let early = row
        .last_polled_at
        .is_some_and(|last| (t - last).num_milliseconds() < row.interval_s * 1000 - EARLY_SLACK_MS);
    let interval = if early {
        row.interval_s + SLOW_DOWN_S
    } else {
        row.interval_s
    };
    diesel::update(cli_logins::table.find(row.id))
        .set((
            cli_logins::last_polled_at.eq(t),
            cli_logins::interval_s.eq(interval),
        ))
        .execute(c)?;
    if early {
        return Ok(Poll::SlowDown(interval));
    }
    if row.denied_at.is_some() {
        return Ok(Poll::Denied);
    }
    if row.expires_at <= t {
        return Ok(Poll::Expired);
    }
    let (Some(_), Some(user)) = (row.approved_at, row.user_id) else {
        return Ok(Poll::Pending);
    };
    let n = diesel::update(
        cli_logins::table
            .find(row.id)
            .filter(cli_logins::redeemed_at.is_null()),
    )
    .set(cli_logins::redeemed_at.eq(t))
    .execute(c)?;
    Ok(if n == 1 {
        Poll::Approved(Approved {
            user,
            client_name: row.client_name,
            client_addr: row.client_addr,
            can_add_credentials: row.can_add_credentials,
        })
    } else {
        Poll::Spent
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_codes_read_back_however_typed() {
        let code = new_user_code();
        assert_eq!(code.len(), 9);
        assert_eq!(normalise_user_code(&code.to_lowercase()), code);
        assert_eq!(normalise_user_code(&code.replace('-', " ")), code);
        assert_eq!(normalise_user_code("bcdf-ghjk"), "BCDF-GHJK");
    }
}
