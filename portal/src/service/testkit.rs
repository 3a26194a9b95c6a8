//! The database layer's test kit, for the service layer's unit tests.

pub use crate::db::testkit::*;
