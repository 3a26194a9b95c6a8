//! Integration tests of the portal with real agents, the real Docker Engine, and both
//! database backends. One binary for all (each file under tests/ would link separately).
// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod browser;
mod checkpoints;
mod cli;
mod cli_login;
mod cli_ssh;
mod cluster;
mod console;
mod failures;
mod foundations;
mod harness;
mod images;
mod interactive;
mod jobs;
mod leases;
mod migration;
mod migrations;
mod oidc_provider;
mod policy;
mod provider_smoke;
mod security;
mod ssh;
mod ssh_keys;
mod sso;
mod web;
