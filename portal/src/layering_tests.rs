//! The layering, checked: handlers (`web/`, `api/`, `broker/`, `ssh/`, `auth/`) translate
//! between their protocol and `service/`, and never name the database layer's queries.
//! They may name its row types (`db::models`, `db::types`) and clock (`db::now`), and
//! they never open a database transaction (`.db.run(`): the service decides what one
//! transaction holds.

use std::path::Path;

/// What of `db::` a handler may name.
const ALLOWED: &[&str] = &["models", "types", "now", "Db", "Backend", "DbConn"];

/// Files that are adapters, not handlers, and why.
const EXEMPT: &[(&str, &str)] = &[(
    "auth/store.rs",
    "the browser-session store is the persistence actix-session calls: storage, no rules",
)];

fn handler_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            handler_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `db::NAME` (and `diesel`) a file's code names, with its line number; comments
/// are skipped.
fn db_names(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if code.contains("diesel") {
            found.push((n + 1, "diesel".to_string()));
        }
        if code.contains(".db.run(") {
            found.push((n + 1, "db.run (a transaction)".to_string()));
        }
        let mut rest = code;
        while let Some(at) = rest.find("db::") {
            let before = rest[..at].chars().last();
            rest = &rest[at + 4..];
            // `crate::db::x`, `db::x` at a word start, `commons_db::x`; not `some_db::x`.
            let crate_name = code[..code.len() - rest.len() - 4].ends_with("commons_");
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') && !crate_name {
                continue;
            }
            let names: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
                let group = group.split('}').next().unwrap_or("");
                group
                    .split(',')
                    .map(|n| n.trim().split("::").next().unwrap_or("").to_string())
                    .collect()
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                vec![name]
            };
            for name in names.into_iter().filter(|n| !n.is_empty() && n != "self") {
                if !ALLOWED.contains(&name.as_str()) {
                    found.push((n + 1, format!("db::{name}")));
                }
            }
        }
    }
    found
}

#[test]
fn handlers_never_name_the_database_layers_queries() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for dir in ["web", "api", "broker", "ssh", "auth"] {
        handler_files(&src.join(dir), &mut files);
    }
    assert!(files.len() > 20, "found only {} handler files", files.len());
    let mut offences = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .to_string();
        if EXEMPT.iter().any(|(f, _)| *f == rel) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for (line, name) in db_names(&text) {
            offences.push(format!("src/{rel}:{line} names {name}"));
        }
    }
    assert!(
        offences.is_empty(),
        "handlers must call service/, not the database layer:\n{}",
        offences.join("\n")
    );
}

#[test]
fn the_check_sees_what_it_must() {
    let names = |t: &str| db_names(t).into_iter().map(|(_, n)| n).collect::<Vec<_>>();
    assert_eq!(names("use crate::db::users;"), ["db::users"]);
    assert_eq!(
        names("use crate::db::{nodes, models::Node};"),
        ["db::nodes"]
    );
    assert_eq!(names("crate::db::audit::list(c)"), ["db::audit"]);
    assert_eq!(
        names("let t = crate::db::now(); // db::jobs"),
        Vec::<String>::new()
    );
    assert_eq!(names("use crate::db::models::Job;"), Vec::<String>::new());
    assert_eq!(names("diesel::sql_query(\"x\")"), ["diesel"]);
    assert_eq!(
        names("let v = state.db.run(nodes::views).await?;"),
        ["db.run (a transaction)"]
    );
    assert_eq!(names("let x = my_db::jobs;"), Vec::<String>::new());
    assert_eq!(
        names("use commons_db::{users, models::User};"),
        ["db::users"]
    );
}
