//! Integration tests of `commons-sim` (one binary, see STYLE.md "Tests").

mod cli;
mod invariants;
mod mechanics;
mod philly;
mod support;
mod tiny;
