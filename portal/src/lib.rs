//! GPU Commons portal: the web UI, the REST API, the agents' broker and the scheduler
//! loop, over one database (SQLite or PostgreSQL).
//!
//! Layout: `db` (models and queries, no HTTP), `api` (JSON handlers), `web` (HTML
//! handlers and their views), `broker` (agents and scheduler), `auth`, `service` (use
//! cases both front ends share), `validate` (pure input rules).

pub mod admin;
pub mod api;
pub mod app;
pub mod auth;
pub mod broker;
pub mod config;
pub mod db;
pub mod demo;
pub mod error;
pub mod members;
pub mod policy;
pub mod service;
pub mod state;
pub mod validate;
pub mod web;

pub use app::{start, RunningPortal};
pub use config::Config;
