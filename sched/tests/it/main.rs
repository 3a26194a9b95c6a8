//! Integration tests of `commons-sched`: one binary (linking is the slow part), with a
//! module per rule family and the property tests.

mod fairshare;
mod lending;
mod owner;
mod placement;
mod props;
mod quota;
mod support;
