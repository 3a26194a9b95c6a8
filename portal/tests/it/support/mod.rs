//! Support for the integration tests: nothing here is a test of its own, except the
//! self-checks of `timeline`.

pub mod browser;
pub mod cluster;
pub mod files;
pub mod fuzzkit;
pub mod harness;
pub mod load;
pub mod oidc_provider;
pub mod screenshot_data;
pub mod session;
pub mod ssh_rig;
pub mod timeline;

/// A test run once per database backend, as two tests named `NAME::sqlite` and
/// `NAME::postgres`, so a failure names its backend. The two never run at once (they
/// may share names of containers, networks or host numbers).
///
/// ```ignore
/// per_backend! {
///     /// What it checks.
///     async fn jobs_run(backend: Backend) { let p = TestPortal::start(backend).await; ... }
/// }
/// ```
macro_rules! per_backend {
    ($(#[$meta:meta])* async fn $name:ident($backend:ident: Backend) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            use $crate::support::harness::Backend;

            static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

            async fn each_backend($backend: Backend) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let _one = ONE_AT_A_TIME.lock().await;
                each_backend(Backend::Sqlite).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let _one = ONE_AT_A_TIME.lock().await;
                each_backend(Backend::Postgres).await
            }
        }
    };
}
