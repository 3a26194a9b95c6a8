//! Who you are and what there is: `whoami`, `nodes`, `usage`.

use crate::args::{JsonFlag, UsageArgs};
use crate::client::Client;
use crate::error::{CliError, Result};
use crate::output::{self, Cell};
use commons_api::account::{Account, LabUsageView};
use commons_api::node::{LendMode, NodeView};
use commons_api::JobState;
use serde_json::Value;

fn of_limit<T: std::fmt::Display>(used: String, limit: Option<T>) -> String {
    match limit {
        Some(l) => format!("{used} / {l}"),
        None => format!("{used} (no limit)"),
    }
}

pub fn whoami(a: JsonFlag) -> Result<u8> {
    let client = Client::signed_in()?;
    let v: Value = client.get("/api/v1/me")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(0);
    }
    let me: Account = client.parse(v)?;
    let name = if me.name.is_empty() || me.name == me.username {
        String::new()
    } else {
        format!(" ({})", me.name)
    };
    println!(
        "{}{name} <{}> on {}{}",
        me.username,
        me.email,
        client.url,
        if me.operator { ", operator" } else { "" }
    );
    let space = |u: &commons_api::files::SpaceUse| {
        use commons_api::files::human_bytes;
        format!(
            "{} of {} ({} file{})",
            human_bytes(u.used_bytes),
            human_bytes(u.quota_bytes),
            u.files,
            if u.files == 1 { "" } else { "s" }
        )
    };
    if let Some(u) = &me.files {
        println!("your files: {}", space(u));
    }
    for l in &me.labs {
        if let Some(u) = &l.lab_files {
            println!("lab {} files: {}", l.slug, space(u));
        }
    }
    if me.labs.is_empty() {
        println!("not a member of any lab yet: ask a lab admin to add you");
        return Ok(0);
    }
    let period = format!("GPU-HOURS ({} DAYS)", me.quota_period_days);
    let rows = me
        .labs
        .iter()
        .map(|l| {
            vec![
                Cell::from(l.slug.as_str()),
                l.role.as_str().into(),
                of_limit(l.gpus_in_use.to_string(), l.quota.max_gpus).into(),
                of_limit(
                    format!("{:.1}", l.gpu_hours_in_period),
                    l.quota.max_gpu_hours,
                )
                .into(),
                l.quota
                    .max_time_limit_minutes
                    .map(|m| output::duration(m * 60))
                    .unwrap_or_else(|| "30d (campus)".into())
                    .into(),
                format!("{} running, {} queued", l.running_jobs, l.queued_jobs).into(),
            ]
        })
        .collect();
    print!(
        "{}",
        output::table(
            &["LAB", "ROLE", "GPUS", &period, "LONGEST JOB", "JOBS"],
            rows,
            output::colour_stdout()
        )
    );
    Ok(0)
}

/// The one lab the caller administers (for `ls --all` without `--lab`).
pub fn only_admin_lab(client: &Client) -> Result<String> {
    let me: Account = client.get("/api/v1/me")?;
    let admin = me.admin_labs();
    match admin.as_slice() {
        [one] => Ok(one.to_string()),
        [] if me.operator => Err(CliError::Usage(
            "name the lab with --lab SLUG (operators see every lab's jobs)".into(),
        )),
        [] => Err(CliError::Forbidden(
            "--all lists a lab's jobs for its admins, and you administer no lab".into(),
        )),
        many => Err(CliError::Usage(format!(
            "you administer several labs ({}): name one with --lab",
            many.join(", ")
        ))),
    }
}

pub fn nodes(a: JsonFlag) -> Result<u8> {
    let client = Client::signed_in()?;
    let v: Value = client.get("/api/v1/nodes")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(0);
    }
    let nodes: Vec<NodeView> = client.parse(v)?;
    if nodes.is_empty() {
        eprintln!("no servers enrolled yet");
        return Ok(0);
    }
    let rows = nodes.iter().map(node_row).collect();
    print!(
        "{}",
        output::table(
            &["ID", "NAME", "LAB", "STATE", "GPUS", "OWNER USE", "LENDS"],
            rows,
            output::colour_stdout()
        )
    );
    Ok(0)
}

/// `commons datasets`: the lab datasets the user may mount.
pub fn datasets(a: JsonFlag) -> Result<u8> {
    let client = Client::signed_in()?;
    let v: Value = client.get("/api/v1/datasets")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(0);
    }
    let sets: Vec<commons_api::datasets::DatasetView> = client.parse(v)?;
    if sets.is_empty() {
        eprintln!("no datasets shared with your labs yet");
        return Ok(0);
    }
    let rows = sets
        .iter()
        .map(|d| {
            let place = if d.exported_by.is_empty() {
                format!("cached on {}", d.cached_on)
            } else {
                format!("on {}", d.exported_by.join(", "))
            };
            vec![
                Cell::from(format!("{}/{}", d.lab, d.name)),
                Cell::from(d.source.clone()),
                Cell::from(place),
                Cell::from(d.description.clone()),
            ]
        })
        .collect();
    print!(
        "{}",
        output::table(
            &["DATASET", "SOURCE", "WHERE", "DESCRIPTION"],
            rows,
            output::colour_stdout()
        )
    );
    Ok(0)
}

/// One server's line: id, name, lab, state, GPUs by model, owner use, lending rules.
fn node_row(n: &NodeView) -> Vec<Cell> {
    let state = match (n.online, n.draining) {
        (false, _) => "offline",
        (true, true) => "draining",
        (true, false) => "online",
    };
    let owner_use = n.gpus.iter().filter(|g| g.local_use).count();
    // Coloured as a running job when online, as a cancelled one when not.
    let state_cell = Cell {
        text: state.to_string(),
        state: Some(if n.online {
            JobState::Running
        } else {
            JobState::Cancelled
        }),
    };
    vec![
        n.id.to_string().into(),
        n.name.as_str().into(),
        n.lab.as_str().into(),
        state_cell,
        gpu_models(n).into(),
        if owner_use > 0 {
            format!("{owner_use} in local use")
        } else {
            String::new()
        }
        .into(),
        lending(n).into(),
    ]
}

/// "2x A100-80GB, 1x RTX4090-24GB": the present GPUs by model, in order of first sight.
fn gpu_models(n: &NodeView) -> String {
    let mut models: Vec<(String, usize)> = Vec::new();
    for g in n.gpus.iter().filter(|g| g.present) {
        match models.iter_mut().find(|(m, _)| *m == g.model) {
            Some((_, c)) => *c += 1,
            None => models.push((g.model.clone(), 1)),
        }
    }
    models
        .iter()
        .map(|(m, c)| format!("{c}x {m}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The lending rules in a few words.
fn lending(n: &NodeView) -> String {
    let mut lends = match n.lending.mode {
        LendMode::Always => "always",
        LendMode::Never => "never",
        LendMode::Windows => "windows",
    }
    .to_string();
    if let Some(max) = n.lending.max_lent_gpus {
        lends.push_str(&format!(", at most {max} GPUs"));
    }
    if let Some(s) = n.lending.max_guest_time_limit_s {
        lends.push_str(&format!(", guest jobs <= {}", output::duration(s)));
    }
    if n.reclaim {
        lends.push_str(", reclaiming");
    }
    lends
}

pub fn usage(a: UsageArgs) -> Result<u8> {
    let client = Client::signed_in()?;
    let path = match &a.lab {
        Some(l) => {
            commons_api::rules::slug("lab", l)?;
            format!("/api/v1/usage?lab={l}")
        }
        None => "/api/v1/usage".to_string(),
    };
    let v: Value = client.get(&path)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(0);
    }
    let labs: Vec<LabUsageView> = client.parse(v)?;
    let colour = output::colour_stdout();
    for (i, l) in labs.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!(
            "lab {}: GPU-hours by week (Monday, UTC), newest first",
            l.lab
        );
        let mut headers = vec!["WEEK"];
        if l.weeks.is_some() {
            headers.extend(["USED", "BORROWED", "LENT"]);
        }
        let names: Vec<&str> = l.members.iter().map(|m| m.username.as_str()).collect();
        headers.extend(names.iter().copied());
        let rows = l
            .week_starts
            .iter()
            .enumerate()
            .map(|(w, start)| {
                let mut row: Vec<Cell> = vec![start.to_string().into()];
                if let Some(weeks) = &l.weeks {
                    let wk = weeks.get(w);
                    for x in [
                        wk.map(|k| k.used),
                        wk.map(|k| k.borrowed),
                        wk.map(|k| k.lent),
                    ] {
                        row.push(format!("{:.2}", x.unwrap_or(0.0)).into());
                    }
                }
                for m in &l.members {
                    row.push(format!("{:.2}", m.gpu_hours.get(w).copied().unwrap_or(0.0)).into());
                }
                row
            })
            .collect();
        print!("{}", output::table(&headers, rows, colour));
    }
    Ok(0)
}
