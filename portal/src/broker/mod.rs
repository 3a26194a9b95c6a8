//! The broker: the agents' endpoint and the scheduler loop.
//!
//! The portal never dials an agent; each agent keeps one WebSocket open and the
//! [`Registry`] holds a sender per connected node. A node has at most one live connection:
//! a newer one replaces the older, whose loop then ends.

pub mod agent;
mod agent_conn;
mod attempt_path;
pub mod checkpoints;
pub mod control;
pub mod datasets;
pub mod inputs;
pub mod limits;
pub mod objects;
pub mod outputs;
pub mod relay;
pub mod tick;

pub use crate::service::agents::Registry;
