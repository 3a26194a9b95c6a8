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
mod demo;
mod disk;
mod estimates;
mod exposure;
mod failures;
mod foundations;
mod fuzz_http;
#[path = "../fuzzkit.rs"]
mod fuzzkit;
mod ha;
mod harness;
mod images;
mod images_cross_lab;
mod interactive;
mod jobs;
mod leases;
mod load;
mod load_smoke;
mod migrate_db;
mod migration;
mod migrations;
mod node_page;
mod noisy;
mod observability;
mod oidc_provider;
mod owner;
mod pages;
mod pages_browser;
mod policy;
mod provider_smoke;
mod screenshot_data;
mod security;
mod sessions;
mod ssh;
mod ssh_keys;
mod ssh_refusals;
mod sso;
mod time_zones;
mod timeline;
mod usage_page;
mod utilization;
mod web;
