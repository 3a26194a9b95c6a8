//! Property-based fuzzing on stable Rust: proptest strategies that take a valid input
//! (a JSON document, a text) and damage it the way attackers and broken clients do,
//! and a runner that counts the cases it ran into `target/fuzz-report.txt` (printed
//! by `scripts/test.sh`). `COMMONS_FUZZ_CASES` sets the budget per harness.

#![allow(dead_code)]

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Map, Value};

/// Cases per harness: `COMMONS_FUZZ_CASES`, else `default`.
pub fn budget(default: u32) -> u32 {
    std::env::var("COMMONS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `check` on `cases` inputs from `strategy`; panics with the smallest failing
/// input; records `name: N cases` in the report.
pub fn run<S: Strategy>(
    name: &str,
    cases: u32,
    strategy: S,
    check: impl FnMut(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let n = std::cell::Cell::new(0u64);
    let check = std::cell::RefCell::new(check);
    let result = runner.run(&strategy, |v| {
        n.set(n.get() + 1);
        (check.borrow_mut())(v)
    });
    report(name, n.get());
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
}

/// Appends `name: N cases` to the workspace's `target/fuzz-report.txt`.
pub fn report(name: &str, n: u64) {
    use std::io::Write;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fuzz-report.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{name}: {n} cases");
    }
}

/// Any JSON value, nested a little, with the strings and numbers that break parsers.
pub fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or(Value::Null)),
        prop_oneof![
            Just(0i64),
            Just(-1),
            Just(1),
            Just(i64::MAX),
            Just(i64::MIN),
            Just(u32::MAX as i64 + 1),
        ]
        .prop_map(|n| json!(n)),
        nasty_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(nasty_string(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Strings with NULs, control characters, right-to-left marks, path tricks, long runs.
pub fn nasty_string() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,12}",
        "[a-z0-9:/@._-]{0,40}",
        Just(String::new()),
        Just("\0".to_string()),
        Just("../../etc/passwd".to_string()),
        Just("\u{202e}gnp.exe".to_string()),
        Just("a".repeat(70_000)),
        Just("NVIDIA_VISIBLE_DEVICES".to_string()),
        Just("'; DROP TABLE jobs; --".to_string()),
        Just("<script>alert(1)</script>".to_string()),
    ]
}

/// What to do to a document.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Replace the value at the `n`-th position (in a walk of the document) by another.
    Replace(usize, Value),
    /// Remove the `n`-th object key.
    Remove(usize),
    /// Add a key (usually unknown) to the `n`-th object.
    Add(usize, String, Value),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), any_json()).prop_map(|(n, v)| Mutation::Replace(n, v)),
        2 => any::<usize>().prop_map(Mutation::Remove),
        1 => (any::<usize>(), nasty_string(), any_json()).prop_map(|(n, k, v)| Mutation::Add(n, k, v)),
    ]
}

/// One of `seeds`, damaged by one to four mutations (or replaced by any JSON at all).
pub fn damaged(seeds: Vec<Value>) -> impl Strategy<Value = Value> {
    let n = seeds.len();
    prop_oneof![
        8 => (0..n, prop::collection::vec(mutation(), 1..5)).prop_map(move |(i, ms)| {
            let mut v = seeds[i].clone();
            for m in ms {
                apply(&mut v, &m);
            }
            v
        }),
        1 => any_json(),
    ]
}

fn count(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count).sum(),
        Value::Object(o) => o.values().map(count).sum(),
        _ => 0,
    }
}

/// Calls `f` on the `k`-th value of a pre-order walk; true once it was found.
fn visit<F: FnOnce(&mut Value)>(v: &mut Value, k: &mut usize, f: &mut Option<F>) -> bool {
    if *k == 0 {
        if let Some(f) = f.take() {
            f(v);
        }
        return true;
    }
    *k -= 1;
    match v {
        Value::Array(a) => a.iter_mut().any(|x| visit(x, k, f)),
        Value::Object(o) => o.values_mut().any(|x| visit(x, k, f)),
        _ => false,
    }
}

fn with_nth(v: &mut Value, n: usize, f: impl FnOnce(&mut Value)) {
    let mut k = n % count(v);
    visit(v, &mut k, &mut Some(f));
}

pub fn apply(v: &mut Value, m: &Mutation) {
    match m {
        Mutation::Replace(n, new) => with_nth(v, *n, |x| *x = new.clone()),
        Mutation::Remove(n) => with_nth(v, *n, |x| {
            if let Value::Object(o) = x {
                if let Some(k) = o.keys().nth(n % o.len().max(1)).cloned() {
                    o.remove(&k);
                }
            }
        }),
        Mutation::Add(n, key, val) => with_nth(v, *n, |x| {
            if let Value::Object(o) = x {
                o.insert(key.clone(), val.clone());
            }
        }),
    }
}

/// `seed` text damaged at the byte level: characters inserted, ranges deleted or
/// repeated, lines swapped (kept valid UTF-8), or any text at all.
pub fn damaged_text(seeds: Vec<String>) -> impl Strategy<Value = String> {
    let n = seeds.len();
    let edit = prop_oneof![
        (any::<usize>(), ".{1,3}").prop_map(|(at, s)| (0u8, at, 0usize, s)),
        (any::<usize>(), 0usize..40).prop_map(|(at, len)| (1u8, at, len, String::new())),
        (any::<usize>(), 0usize..40).prop_map(|(at, len)| (2u8, at, len, String::new())),
    ];
    prop_oneof![
        8 => (0..n, prop::collection::vec(edit, 1..6)).prop_map(move |(i, edits)| {
            let mut chars: Vec<char> = seeds[i].chars().collect();
            for (kind, at, len, s) in edits {
                let at = at % (chars.len() + 1);
                let end = (at + len).min(chars.len());
                match kind {
                    0 => {
                        for (j, c) in s.chars().enumerate() {
                            chars.insert(at + j, c);
                        }
                    }
                    1 => {
                        chars.drain(at..end);
                    }
                    _ => {
                        let piece: Vec<char> = chars[at..end].to_vec();
                        for (j, c) in piece.into_iter().enumerate() {
                            chars.insert(end + j, c);
                        }
                    }
                }
            }
            chars.into_iter().collect()
        }),
        1 => ".{0,200}",
    ]
}

/// `n` inputs drawn from `strategy` (for harnesses that must await between cases; a
/// failure then names the whole input instead of a shrunk one).
pub fn samples<S: Strategy>(strategy: S, n: u32) -> Vec<S::Value> {
    let mut runner = TestRunner::default();
    (0..n)
        .filter_map(|_| strategy.new_tree(&mut runner).ok().map(|t| t.current()))
        .collect()
}
