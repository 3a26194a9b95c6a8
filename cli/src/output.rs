//! How things look: aligned tables for people, colour only on a terminal (and never with
//! `NO_COLOR`), times and durations in words, durations read from the command line.

use crate::error::{CliError, Result};
use chrono::{NaiveDateTime, Utc};
use commons_api::JobState;
use std::io::IsTerminal;

/// Colour on stdout: a terminal, `NO_COLOR` unset, `TERM` not `dumb`.
pub fn colour_stdout() -> bool {
    colour_for(std::io::stdout().is_terminal())
}

/// The same for stderr (progress and state changes).
pub fn colour_stderr() -> bool {
    colour_for(std::io::stderr().is_terminal())
}

fn colour_for(terminal: bool) -> bool {
    terminal
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        && std::env::var("TERM").map_or(true, |t| t != "dumb")
}

/// The ANSI colour of a job state.
fn state_colour(state: JobState) -> &'static str {
    match state {
        JobState::Succeeded => "32",
        JobState::Failed => "31",
        JobState::Cancelled => "90",
        JobState::Running | JobState::Starting => "34",
        JobState::Queued | JobState::Preempting => "33",
    }
}

/// `text` in the colour of `state` when `on`.
pub fn paint_state(text: &str, state: JobState, on: bool) -> String {
    if on {
        format!("\x1b[{}m{text}\x1b[0m", state_colour(state))
    } else {
        text.to_string()
    }
}

/// A table cell: its text, and the state whose colour it takes (if any).
pub struct Cell {
    pub text: String,
    pub state: Option<JobState>,
}

impl From<String> for Cell {
    fn from(text: String) -> Cell {
        Cell { text, state: None }
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Cell {
        Cell {
            text: text.to_string(),
            state: None,
        }
    }
}

impl Cell {
    pub fn state(state: JobState) -> Cell {
        Cell {
            text: state.to_string(),
            state: Some(state),
        }
    }
}

/// Columns padded to their widest cell (in characters); the last column is not padded.
pub fn table(headers: &[&str], rows: Vec<Vec<Cell>>, colour: bool) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, c) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.text.chars().count());
            }
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<(String, Option<JobState>)>, out: &mut String| {
        let n = cells.len();
        let mut s = String::new();
        for (i, (text, state)) in cells.into_iter().enumerate() {
            let pad = if i + 1 < n {
                widths[i].saturating_sub(text.chars().count()) + 2
            } else {
                0
            };
            match state {
                Some(st) => s.push_str(&paint_state(&text, st, colour)),
                None => s.push_str(&text),
            }
            s.push_str(&" ".repeat(pad));
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    let head = headers.iter().map(|h| (h.to_string(), None)).collect();
    if colour {
        out.push_str("\x1b[1m");
        line(head, &mut out);
        out.insert_str(out.len() - 1, "\x1b[0m");
    } else {
        line(head, &mut out);
    }
    for row in rows {
        line(
            row.into_iter().map(|c| (c.text, c.state)).collect(),
            &mut out,
        );
    }
    out
}

/// Minutes in a duration such as `90`, `90m`, `2h`, `1h30m`, `3d`, `1d12h` (a bare
/// number is minutes). Refusals name the API's field, `time_limit_minutes`.
pub fn parse_minutes(text: &str) -> Result<i64> {
    let bad = || CliError::Invalid {
        field: "time_limit_minutes".into(),
        message: format!(
            "{text:?} is not a duration: write 90 (minutes), 90m, 2h, 1h30m or 3d (--time)"
        ),
    };
    let t = text.trim().to_ascii_lowercase();
    if t.is_empty() {
        return Err(bad());
    }
    if let Ok(n) = t.parse::<i64>() {
        return Ok(n);
    }
    let mut total: i64 = 0;
    let mut num = String::new();
    let mut chars = t.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: i64 = num.parse().map_err(|_| bad())?;
        num.clear();
        let unit = match c {
            'd' => 24 * 60,
            'h' => 60,
            'm' => {
                // "min" is a minute too.
                if chars.peek() == Some(&'i') {
                    chars.next();
                    if chars.next() != Some('n') {
                        return Err(bad());
                    }
                }
                1
            }
            _ => return Err(bad()),
        };
        total = n
            .checked_mul(unit)
            .and_then(|m| total.checked_add(m))
            .ok_or_else(bad)?;
    }
    if !num.is_empty() {
        return Err(bad());
    }
    Ok(total)
}

/// `2h 05m`, `45s`, `3d 4h` for a number of seconds.
pub fn duration(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86400, (s % 86400) / 3600),
    }
}

/// "3m 05s ago" for an API time (UTC).
pub fn ago(at: NaiveDateTime) -> String {
    format!(
        "{} ago",
        duration((Utc::now().naive_utc() - at).num_seconds())
    )
}

/// An API time (UTC) as `2026-12-03 08:12:00 UTC`.
pub fn when(at: NaiveDateTime) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_minutes() {
        for (text, min) in [
            ("90", 90),
            ("90m", 90),
            ("45min", 45),
            ("2h", 120),
            ("1h30m", 90),
            ("3d", 4320),
            ("1d12h", 2160),
            (" 2H ", 120),
        ] {
            assert_eq!(parse_minutes(text).unwrap(), min, "{text}");
        }
        for bad in ["", "h", "2x", "1h30", "1.5h", "-", "99999999999999999999d"] {
            match parse_minutes(bad) {
                Err(CliError::Invalid { field, .. }) => {
                    assert_eq!(field, "time_limit_minutes")
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn tables_align_and_colour_only_when_asked() {
        let rows = vec![
            vec![
                Cell::from("1"),
                Cell::state(JobState::Running),
                Cell::from("n1"),
            ],
            vec![
                Cell::from("100"),
                Cell::state(JobState::Queued),
                Cell::from(""),
            ],
        ];
        let t = table(&["ID", "STATE", "NODE"], rows, false);
        assert_eq!(t, "ID   STATE    NODE\n1    running  n1\n100  queued\n");
        let rows = vec![vec![Cell::from("1"), Cell::state(JobState::Failed)]];
        let t = table(&["ID", "STATE"], rows, true);
        assert!(t.contains("\x1b[31mfailed\x1b[0m"), "{t:?}");
    }

    #[test]
    fn durations_in_words() {
        assert_eq!(duration(5), "5s");
        assert_eq!(duration(125), "2m 05s");
        assert_eq!(duration(3 * 3600 + 60), "3h 01m");
        assert_eq!(duration(90000), "1d 1h");
    }
}
