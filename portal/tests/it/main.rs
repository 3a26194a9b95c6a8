//! Integration tests of the portal with real agents, the real Docker Engine, and both
//! database backends. One binary for all (each file under tests/ would link separately).
// Test helpers outside #[test] functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// What the tests share (portals, agents, browsers, a cluster of processes, the OIDC
// provider, fuzzing); the test files are the rest.
#[macro_use]
mod support;
// `support::timeline` names it here, as the soak example (which includes both) has it.
use support::cluster;

mod app_presets;
mod apps;
mod apps_bench;
mod apps_jupyter;
mod apps_stream;
mod checkpoints;
mod cli;
mod cli_login;
mod cli_ssh;
mod console;
mod datasets;
mod datasets_https;
mod demo;
mod disk;
mod estimates;
mod exposure;
mod failures;
mod files;
mod files_bench;
mod files_clients;
mod files_cp_parts;
mod files_inputs;
mod files_outputs;
mod files_parts;
mod files_signed;
mod files_walkthrough;
mod flows_arrays;
mod flows_deps;
mod flows_names;
mod flows_walkthrough;
mod foundations;
mod fuzz_http;
mod ha;
mod images;
mod images_cross_lab;
mod interactive;
mod jobs;
mod leases;
mod load_smoke;
mod migrate_db;
mod migration;
mod migrations;
mod node_page;
mod noisy;
mod notifications;
mod notify_more;
mod observability;
mod owner;
mod pages;
mod pages_browser;
mod policy;
mod provider_smoke;
mod security;
mod sessions;
mod shares;
mod ssh;
mod ssh_env;
mod ssh_keys;
mod ssh_refusals;
mod sso;
mod time_zones;
mod usage_page;
mod utilization;
mod web;
