//! Every migration applies and reverts on both backends.

use crate::support::harness::{Backend, TestDb, BACKENDS};
use commons_portal::db::{establish, DbConn, POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS};
use diesel_migrations::MigrationHarness;

#[test]
fn migrations_apply_and_revert_on_both_backends() {
    for backend in BACKENDS {
        let db = TestDb::new(backend);
        let mut c = establish(&db.url).unwrap();
        let source = || match backend {
            Backend::Postgres => POSTGRES_MIGRATIONS,
            Backend::Sqlite => SQLITE_MIGRATIONS,
        };
        assert_eq!(matches!(c, DbConn::Pg(_)), backend == Backend::Postgres);
        let applied = c.run_pending_migrations(source()).unwrap().len();
        assert!(applied > 0, "{backend:?}");
        let reverted = c.revert_all_migrations(source()).unwrap().len();
        assert_eq!(applied, reverted, "{backend:?}");
        c.run_pending_migrations(source()).unwrap();
        assert!(!c.has_pending_migration(source()).unwrap());
    }
}

#[test]
fn both_backends_have_the_same_migrations() {
    let names = |dir: &str| {
        let mut v: Vec<String> = std::fs::read_dir(format!(
            "{}/../migrations/{dir}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
        v.sort();
        v
    };
    assert_eq!(names("sqlite"), names("postgres"));
    // Diesel keys a migration by the part of its name before the first `_`: two with one
    // version and one of them is never applied (two branches once both took 000000).
    let versions: std::collections::BTreeSet<String> = names("sqlite")
        .iter()
        .map(|n| n.split('_').next().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        versions.len(),
        names("sqlite").len(),
        "one version per migration"
    );
}
