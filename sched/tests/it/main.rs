//! Integration tests of `commons-sched`: one binary (linking is the slow part), with a
//! module per rule family and the property tests.
// Helpers outside `#[test]` functions unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod capacity;
mod checkpoints;
mod churn;
mod estimate;
mod fairshare;
mod interactive;
mod lending;
mod owner;
mod placement;
mod props;
mod quota;
mod shares;
mod support;
mod taken_back;
