//! Integration tests of `commons-sim` (one binary, see STYLE.md "Tests").
// Helpers outside `#[test]` functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod baselines;
mod checkpoints;
mod cli;
mod fuzz;
#[path = "../../../portal/tests/it/support/fuzzkit.rs"]
mod fuzzkit;
mod interactive;
mod invariants;
mod mechanics;
mod openb;
mod philly;
mod suite;
mod support;
mod tiny;
