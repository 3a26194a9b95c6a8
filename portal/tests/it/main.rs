//! Integration tests of the portal with real agents, the real Docker Engine, and both
//! database backends. One binary for all (each file under tests/ would link separately).

mod browser;
mod console;
mod foundations;
mod harness;
mod jobs;
mod migrations;
mod oidc_provider;
mod policy;
mod provider_smoke;
mod sso;
mod web;
