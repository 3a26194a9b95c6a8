//! GPU Commons portal: the web UI, the REST API, the agents' broker and the scheduler
//! loop, over one database (SQLite or PostgreSQL).
//!
//! Layers, imports pointing down only: `main`/`app`/`demo`/`admin` (wiring); `web`, `api`
//! (HTTP handlers); `broker` (agents' WebSocket, scheduler tick); `auth` (who is asking,
//! CSRF); `service` (use cases and read models); `db` (schema, typed rows, queries: the
//! `commons-db` crate, under its old name);
//! domain types any layer may use (`domain`, `identity`, `pubkey`, `validate`, `config`,
//! `error`, `metrics`).

pub mod admin;
pub mod api;
pub mod app;
pub mod apps;
pub mod auth;
pub mod broker;
pub mod client_addr;
pub mod config;
pub mod demo;
pub mod error;
pub mod identity;
pub mod metrics;
pub mod pubkey;
pub mod service;
pub mod ssh;
pub mod state;
pub mod validate;
pub mod web;

// The database layer is its own crate (no HTTP in it); these keep the paths the
// portal's modules have always used.
pub use commons_db as db;
pub use commons_db::domain;

#[cfg(test)]
mod layering_tests;

pub use app::{start, RunningPortal};
pub use config::Config;
