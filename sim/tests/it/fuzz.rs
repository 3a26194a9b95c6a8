//! Fuzzing the simulator's inputs (property-based, `fuzzkit`): a damaged campus file or
//! trace is an error naming what is wrong, never a panic.

use crate::fuzzkit::{budget, damaged_text, run};

#[test]
fn the_campus_parser_never_panics() {
    let shipped = include_str!("../../campus/philly15.toml").to_string();
    let small = "[[lab]]\nname = \"vision\"\nshare = 1.0\n[[lab.node]]\ncount = 2\ngpus = 8\nmodel = \"A100-80GB\"\n".to_string();
    run(
        "campus file (TOML)",
        budget(1500),
        damaged_text(vec![shipped, small]),
        |text| {
            if let Ok(file) = commons_sim::campus::CampusFile::parse(&text) {
                let _ = file.build();
            }
            Ok(())
        },
    );
}

#[test]
fn the_trace_parser_never_panics() {
    let trace: String = include_str!("../../traces/philly_sep_oct_2017.csv")
        .lines()
        .take(40)
        .collect::<Vec<_>>()
        .join("\n");
    run(
        "job trace (CSV)",
        budget(1500),
        damaged_text(vec![trace]),
        |text| {
            let _ = commons_sim::trace::parse_trace(&text, None);
            Ok(())
        },
    );
}
