//! Following a job: its state changes (on stderr) and its output (on stdout) until it
//! ends. `commons run --follow`, `commons submit --follow` and `commons logs -f`.
//!
//! 1. Every [`POLL`]: read the job; print the history entries not printed yet (the
//!    final one only at the end, after the last output).
//! 2. Read the output from the byte already printed on (`?offset=`), print it.
//! 3. While the job waits and stderr is a terminal, a progress line says for how long
//!    and why; it is cleared before anything else is printed.
//! 4. Once the job has ended, read the output twice more (the last chunks may trail the
//!    final state by a moment), then return the job as it ended.

use crate::args::LogsArgs;
use crate::client::Client;
use crate::error::Result;
use crate::output;
use commons_api::{JobEvent, JobView};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(700);
const SPINNER: [char; 4] = ['|', '/', '-', '\\'];

struct Follower<'a> {
    client: &'a Client,
    id: i64,
    offset: usize,
    events_seen: usize,
    progress_shown: bool,
    colour: bool,
}

impl Follower<'_> {
    fn clear_progress(&mut self) {
        if self.progress_shown {
            eprint!("\r\x1b[2K");
            self.progress_shown = false;
        }
    }

    fn print_output(&mut self) -> Result<()> {
        let (text, total) = self.client.text(&format!(
            "/api/v1/jobs/{}/logs?offset={}",
            self.id, self.offset
        ))?;
        if text.is_empty() {
            return Ok(());
        }
        self.clear_progress();
        let mut out = std::io::stdout().lock();
        // A closed pipe (`| head`) ends the printing, not the program's exit status.
        let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
        self.offset = total.unwrap_or(self.offset + text.len());
        Ok(())
    }

    /// Prints the history entries not printed yet, up to the first final one (which
    /// waits for `finals`, so that the job's last output comes before its end).
    fn print_events(&mut self, finals: bool) -> Result<()> {
        let events: Vec<JobEvent> = self
            .client
            .get(&format!("/api/v1/jobs/{}/events", self.id))?;
        for e in events.iter().skip(self.events_seen) {
            if e.state.is_final() && !finals {
                break;
            }
            self.clear_progress();
            let at = e.at.format("%H:%M:%S");
            // Padded before it is coloured: escape codes take no room on the screen.
            let state = format!("{:<10}", e.state);
            eprintln!(
                "[{at}] {} {}",
                output::paint_state(&state, e.state, self.colour),
                e.message
            );
            self.events_seen += 1;
        }
        Ok(())
    }
}

/// Follows job `id` until it ends; with `events`, its state changes too.
pub fn follow(client: &Client, id: i64, events: bool) -> Result<JobView> {
    let progress = events && std::io::stderr().is_terminal();
    let mut f = Follower {
        client,
        id,
        offset: 0,
        events_seen: 0,
        progress_shown: false,
        colour: output::colour_stderr(),
    };
    let started = Instant::now();
    let mut tick = 0usize;
    loop {
        let job: JobView = client.get(&format!("/api/v1/jobs/{id}"))?;
        if events {
            f.print_events(false)?;
        }
        f.print_output()?;
        if job.state.is_final() {
            for _ in 0..2 {
                std::thread::sleep(Duration::from_millis(300));
                f.print_output()?;
            }
            if events {
                f.print_events(true)?;
            }
            f.clear_progress();
            return Ok(job);
        }
        if progress && job.state.is_waiting() {
            let why = job.reason.clone().unwrap_or_default();
            let pos = job
                .queue_position
                .map(|p| format!(", #{p} in queue"))
                .unwrap_or_default();
            eprint!(
                "\r\x1b[2K{} {} for {}{pos}{}",
                SPINNER[tick % SPINNER.len()],
                job.state,
                output::duration(started.elapsed().as_secs() as i64),
                if why.is_empty() {
                    String::new()
                } else {
                    format!(": {why}")
                }
            );
            let _ = std::io::stderr().flush();
            f.progress_shown = true;
        }
        tick += 1;
        std::thread::sleep(POLL);
    }
}

pub fn logs(a: LogsArgs) -> Result<u8> {
    let client = Client::signed_in()?;
    if a.follow {
        follow(&client, a.id, false)?;
        return Ok(0);
    }
    let (text, _) = client.text(&format!("/api/v1/jobs/{}/logs", a.id))?;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
    Ok(0)
}
