//! Tests of the dataset cache and archives: temp dirs, and a local HTTP(S) server.

mod archive;
mod cache;
mod server;
