//! Browser sessions kept by the server: a copied cookie is worth nothing after logout or
//! "sign out everywhere", and idle and absolute expiry are the server's to enforce.

use crate::support::harness::{Backend, TestPortal};
use crate::support::session::BrowserSession;
use commons_portal::db::schema::web_sessions;
use diesel::prelude::*;

/// The status of `GET /jobs` in session `s`: 200 signed in, 303 (to the login) not.
async fn jobs_status(s: &BrowserSession) -> u16 {
    s.fetch("/jobs").await.status().as_u16()
}

async fn sql<T: Send + 'static>(
    p: &TestPortal,
    f: impl FnOnce(&mut commons_portal::db::DbConn) -> QueryResult<T> + Send + 'static,
) -> T {
    p.portal
        .state
        .db
        .run(move |c| f(c).map_err(commons_portal::error::AppError::from))
        .await
        .unwrap()
}

per_backend! {
    async fn a_copied_cookie_is_worth_nothing_after_logout(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let alice = BrowserSession::login(&p, "alice").await;
        let copy = BrowserSession::with_copied_cookie(&p, &alice.cookie());
        assert_eq!(jobs_status(&alice).await, 200, "{backend:?}");
        assert_eq!(jobs_status(&copy).await, 200, "{backend:?}: the copy works, for now");
        let r = alice.post_form("/logout", &[]).await;
        assert_eq!(r.status(), 303, "{backend:?}: logout");
        assert_eq!(
            jobs_status(&copy).await,
            303,
            "{backend:?}: the cookie copied before logout no longer signs anyone in"
        );
        // The database holds the key's hash only, never the cookie's key itself.
        let rows: Vec<String> = sql(&p, |c| {
            web_sessions::table
                .select(web_sessions::id_hash)
                .load::<String>(c)
        })
        .await;
        assert!(rows.iter().all(|h| h.len() == 64), "{backend:?}: {rows:?}");
        p.stop().await;
    }
}

per_backend! {
    async fn sign_out_everywhere_ends_every_session_of_the_user_and_no_other(backend: Backend) {
        let p = TestPortal::start(backend).await;
        let (a1, a2, b1) = (
            BrowserSession::login(&p, "alice").await,
            BrowserSession::login(&p, "alice").await,
            BrowserSession::login(&p, "bob").await,
        );
        let page = a1.page("/tokens").await;
        assert!(
            page.contains("Signed in in 2 browser sessions"),
            "{backend:?}: the tokens page counts alice's sessions"
        );

        // Refusals first: a member for another user, an unknown user.
        let (s, body) = p
            .post_json(
                &p.bob,
                "/api/v1/users/alice/sign-out",
                &serde_json::json!({}),
            )
            .await;
        assert_eq!(s, 403, "{backend:?}: {body}");
        let (s, body) = p
            .post_json(
                &p.olga,
                "/api/v1/users/nobody/sign-out",
                &serde_json::json!({}),
            )
            .await;
        assert_eq!(s, 404, "{backend:?}: {body}");
        assert_eq!(jobs_status(&a1).await, 200, "{backend:?}: untouched");

        // The operator signs alice out everywhere.
        let (s, body) = p
            .post_json(
                &p.olga,
                "/api/v1/users/alice/sign-out",
                &serde_json::json!({}),
            )
            .await;
        assert_eq!(s, 200, "{backend:?}: {body}");
        assert_eq!(body["sessions_ended"], 2, "{backend:?}: {body}");
        assert_eq!(jobs_status(&a1).await, 303, "{backend:?}: first");
        assert_eq!(jobs_status(&a2).await, 303, "{backend:?}: second");
        assert_eq!(jobs_status(&b1).await, 200, "{backend:?}: bob stays");
        let audit = sql(&p, |c| {
            use commons_portal::db::schema::audit_log;
            audit_log::table
                .filter(audit_log::action.eq("sign out everywhere"))
                .select((audit_log::actor, audit_log::target, audit_log::after))
                .load::<(String, String, String)>(c)
        })
        .await;
        assert_eq!(
            audit,
            vec![(
                "olga".to_string(),
                "alice".to_string(),
                "2 sessions ended".to_string()
            )],
            "{backend:?}"
        );

        // Bob signs himself out everywhere from the tokens page's button.
        let b2 = BrowserSession::login(&p, "bob").await;
        let r = b2.post_form("/sessions/sign-out-everywhere", &[]).await;
        assert_eq!(r.status(), 303, "{backend:?}");
        assert_eq!(r.headers()["location"], "/login");
        assert_eq!(jobs_status(&b1).await, 303, "{backend:?}: bob's first");
        assert_eq!(jobs_status(&b2).await, 303, "{backend:?}: bob's second");

        // The operator CLI does the same.
        let c1 = BrowserSession::login(&p, "carol").await;
        let out = commons_portal::admin::sign_out(&p.portal.state.db, "carol").unwrap();
        assert_eq!(out, "ended 1 browser session(s) of carol");
        assert_eq!(jobs_status(&c1).await, 303, "{backend:?}: carol");
        let err = commons_portal::admin::sign_out(&p.portal.state.db, "zed").unwrap_err();
        assert!(err.to_string().contains("no user \"zed\""), "{err}");
        p.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_absolute_expiry_are_the_servers() {
    let p = TestPortal::builder(Backend::Sqlite)
        .config(|c| c.session_absolute_hours = 24)
        .start()
        .await;
    // Idle: the row's expiry, whatever the cookie says.
    let alice = BrowserSession::login(&p, "alice").await;
    assert_eq!(jobs_status(&alice).await, 200);
    sql(&p, |c| {
        diesel::update(web_sessions::table)
            .set(
                web_sessions::expires_at
                    .eq(chrono::Utc::now().naive_utc() - chrono::Duration::seconds(1)),
            )
            .execute(c)
    })
    .await;
    assert_eq!(jobs_status(&alice).await, 303, "idle past its expiry");

    // Absolute: the login time in the stored state; a day-old login is out however
    // active its session was.
    let alice = BrowserSession::login(&p, "alice").await;
    let old = chrono::Utc::now().timestamp() - 25 * 3600;
    let states: Vec<(String, String)> = sql(&p, |c| {
        web_sessions::table
            .filter(web_sessions::user_id.is_not_null())
            .select((web_sessions::id_hash, web_sessions::state))
            .load(c)
    })
    .await;
    assert_eq!(states.len(), 1);
    let (hash, state) = states[0].clone();
    let mut map: std::collections::HashMap<String, String> = serde_json::from_str(&state).unwrap();
    assert_eq!(jobs_status(&alice).await, 200, "fresh login");
    map.insert("login_at".into(), old.to_string());
    let state = serde_json::to_string(&map).unwrap();
    sql(&p, move |c| {
        diesel::update(web_sessions::table.filter(web_sessions::id_hash.eq(hash)))
            .set(web_sessions::state.eq(state))
            .execute(c)
    })
    .await;
    assert_eq!(jobs_status(&alice).await, 303, "logged in 25 h ago");

    // A visitor who never signs in holds a row for at most an hour.
    let r = BrowserSession::anonymous(&p).fetch("/login").await;
    assert!(r.headers().contains_key("set-cookie"));
    let anon: Vec<chrono::NaiveDateTime> = sql(&p, |c| {
        web_sessions::table
            .filter(web_sessions::user_id.is_null())
            .select(web_sessions::expires_at)
            .load(c)
    })
    .await;
    assert!(!anon.is_empty());
    let limit = chrono::Utc::now().naive_utc() + chrono::Duration::seconds(3600 + 5);
    assert!(anon.iter().all(|e| *e <= limit), "{anon:?}");
    p.stop().await;
}
