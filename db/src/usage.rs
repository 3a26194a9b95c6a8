//! A lab's usage by week, for its console: GPU-hours its members used (and how much of
//! that was borrowed from other labs), and GPU-hours others used on its servers (lent).
//! Derived from the attempts, split exactly at week boundaries (Monday 00:00 UTC).

use super::models::Attempt;
use super::schema::*;
use super::DbConn;
use super::DbError;
use chrono::{Datelike, Duration, NaiveDate, NaiveDateTime};
use diesel::prelude::*;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct WeekUsage {
    /// Monday of the week.
    pub week: NaiveDate,
    pub used: f64,
    pub borrowed: f64,
    pub lent: f64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabUsage {
    /// Newest week first.
    pub weeks: Vec<WeekUsage>,
    /// Member -> GPU-hours per week, in the order of `weeks`.
    pub members: Vec<(String, Vec<f64>)>,
}

fn monday(t: NaiveDateTime) -> NaiveDateTime {
    let d = t.date();
    let back = d.weekday().num_days_from_monday() as i64;
    (d - Duration::days(back)).and_time(chrono::NaiveTime::MIN)
}

/// GPU-hours of `gpus` GPUs busy from `start` to `end` that fall in each week.
fn split(start: NaiveDateTime, end: NaiveDateTime, gpus: f64, weeks: &[NaiveDateTime]) -> Vec<f64> {
    weeks
        .iter()
        .map(|w| {
            let (a, b) = (start.max(*w), end.min(*w + Duration::days(7)));
            if b > a {
                // Not whole seconds: truncating each week's part lost up to a second
                // per week an attempt spans.
                (b - a).as_seconds_f64() / 3600.0 * gpus
            } else {
                0.0
            }
        })
        .collect()
}

pub fn lab_usage(
    c: &mut DbConn,
    lab: i64,
    now: NaiveDateTime,
    n_weeks: usize,
) -> Result<LabUsage, DbError> {
    let this = monday(now);
    let weeks: Vec<NaiveDateTime> = (0..n_weeks as i64)
        .map(|i| this - Duration::days(7 * i))
        .collect();
    let since = weeks.last().copied().unwrap_or(this);
    // Attempts of this lab's jobs (used) or on this lab's nodes (possibly lent).
    let rows: Vec<(Attempt, i64, String, i64)> = job_attempts::table
        .inner_join(jobs::table.inner_join(users::table))
        .inner_join(nodes::table)
        .filter(job_attempts::started_at.is_not_null())
        .filter(
            job_attempts::ended_at
                .is_null()
                .or(job_attempts::ended_at.gt(since)),
        )
        .filter(jobs::lab_id.eq(lab).or(nodes::lab_id.eq(lab)))
        .select((
            Attempt::as_select(),
            jobs::lab_id,
            users::username,
            nodes::lab_id,
        ))
        .load(c)?;
    let mut out: Vec<WeekUsage> = weeks
        .iter()
        .map(|w| WeekUsage {
            week: w.date(),
            ..Default::default()
        })
        .collect();
    let mut members: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (a, job_lab, user, node_lab) in rows {
        let Some(start) = a.started_at else {
            continue; // the query keeps started attempts only
        };
        let end = a.ended_at.unwrap_or(now).min(now);
        let hours = split(start, end, a.gpu_amount(), &weeks);
        for (i, h) in hours.iter().enumerate() {
            if job_lab == lab {
                out[i].used += h;
                if node_lab != lab {
                    out[i].borrowed += h;
                }
                members
                    .entry(user.clone())
                    .or_insert_with(|| vec![0.0; n_weeks])[i] += h;
            } else if node_lab == lab {
                out[i].lent += h;
            }
        }
    }
    Ok(LabUsage {
        weeks: out,
        members: members.into_iter().collect(),
    })
}

/// Each member's use of the lab's account now: GPUs their running attempts hold, and
/// GPU-hours over the last `period_s` seconds (what member quotas count), by username.
pub fn member_use(
    c: &mut DbConn,
    lab: i64,
    now: NaiveDateTime,
    period_s: i64,
) -> Result<BTreeMap<String, (u32, f64)>, DbError> {
    let since = now - Duration::seconds(period_s);
    let rows: Vec<(Attempt, String)> = job_attempts::table
        .inner_join(jobs::table.inner_join(users::table))
        .filter(jobs::lab_id.eq(lab))
        .filter(job_attempts::started_at.is_not_null())
        .filter(
            job_attempts::ended_at
                .is_null()
                .or(job_attempts::ended_at.gt(since)),
        )
        .select((Attempt::as_select(), users::username))
        .load(c)?;
    let mut out: BTreeMap<String, (u32, f64)> = BTreeMap::new();
    for (a, user) in rows {
        let Some(start) = a.started_at else {
            continue;
        };
        // GPUs held now count whole (a share holds one); hours count a share's fraction.
        let gpus = a.gpu_id_list().len();
        let end = a.ended_at.unwrap_or(now).min(now);
        let e = out.entry(user).or_default();
        if a.ended_at.is_none() && a.status().is_active() {
            e.0 += gpus as u32;
        }
        let seconds = (end - start.max(since)).as_seconds_f64().max(0.0);
        e.1 += seconds / 3600.0 * a.gpu_amount();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M").unwrap()
    }

    #[test]
    fn weeks_start_on_monday_and_split_exactly() {
        // 2026-12-02 is a Wednesday.
        assert_eq!(monday(t("2026-12-02 15:00")), t("2026-11-30 00:00"));
        let weeks = [t("2026-11-30 00:00"), t("2026-11-23 00:00")];
        // Sunday 22:00 to Monday 02:00 on 2 GPUs: 4 GPU-hours each side.
        let h = split(t("2026-11-29 22:00"), t("2026-11-30 02:00"), 2.0, &weeks);
        assert_eq!(h, vec![4.0, 4.0]);
    }

    #[test]
    fn an_attempt_across_a_week_boundary_loses_no_fraction_of_a_second() {
        let monday = t("2026-12-07 00:00");
        let start = monday - Duration::milliseconds(3_600_500);
        let end = monday + Duration::milliseconds(3_600_700);
        let weeks = [monday, monday - Duration::days(7)];
        let parts = split(start, end, 1.0, &weeks);
        let total: f64 = parts.iter().sum();
        let expected = (end - start).as_seconds_f64() / 3600.0;
        assert!(
            (total - expected).abs() < 1e-9,
            "{parts:?} against {expected}"
        );
    }

    /// One attempt of its own job per entry of `shares` (`None`: a whole GPU), all on the
    /// test campus's first GPU, started at `start` and ended at `end`: the lab and the
    /// attempts.
    fn ended_attempts(
        c: &mut DbConn,
        shares: &[Option<commons_sched::GpuShare>],
        start: NaiveDateTime,
        end: NaiveDateTime,
    ) -> (i64, Vec<crate::plan::NewAttempt>) {
        use crate::schema::job_attempts;
        let campus = crate::testkit::campus(c, 0);
        let gpu = crate::nodes::list_with_gpus(c).unwrap()[0].2[0].id;
        let lab = campus.node.lab_id;
        let mut new = Vec::new();
        for &share in shares {
            let job = crate::jobs::insert(c, 1, &crate::testkit::demo_job(lab)).unwrap();
            new.push(crate::plan::NewAttempt {
                job: job.id,
                attempt: 1,
                node: campus.node.id,
                gpus: vec![gpu],
                lease_until: end,
                share,
            });
        }
        crate::plan::insert_attempts(c, &new, start).unwrap();
        diesel::update(job_attempts::table)
            .set((
                job_attempts::started_at.eq(Some(start)),
                job_attempts::ended_at.eq(Some(end)),
            ))
            .execute(c)
            .unwrap();
        (lab, new)
    }

    /// A member's GPU-hours (the lab page's and the overview's, shown against member
    /// quotas) keep the fraction of a second each attempt ran past a whole one (it was
    /// cut off).
    #[test]
    fn a_members_hours_keep_fractions_of_a_second() {
        let (_dir, mut c) = crate::testkit::sqlite();
        let now = crate::now();
        let start = now - Duration::hours(2);
        // Two attempts of 1 h 0 min 0.75 s each: 2 h 1.5 s in all.
        let ran = Duration::milliseconds(3_600_750);
        let (lab, _) = ended_attempts(&mut c, &[None, None], start, start + ran);
        let used = member_use(&mut c, lab, now, 86_400).unwrap();
        let hours: f64 = used.values().map(|u| u.1).sum();
        let expected = 2.0 * ran.as_seconds_f64() / 3600.0;
        assert!(
            (hours - expected).abs() < 1e-9,
            "{hours} GPU-hours against {expected}"
        );
    }

    /// A quarter of a GPU for 4 hours is 1 GPU-hour; a whole GPU for 4 hours is 4.
    #[test]
    fn a_share_counts_as_its_fraction_of_its_gpu() {
        let (_dir, mut c) = crate::testkit::sqlite();
        let now = crate::now();
        let start = now - Duration::hours(4);
        let share = commons_sched::GpuShare {
            milli: 250,
            memory_mb: 10_240,
        };
        let (lab, new) = ended_attempts(&mut c, &[Some(share), None], start, now);
        let usage = lab_usage(&mut c, lab, now, 2).unwrap();
        let used: f64 = usage.weeks.iter().map(|w| w.used).sum();
        assert!(
            (used - 5.0).abs() < 1e-6,
            "1 GPU-hour for the share, 4 for the whole GPU: {used}"
        );
        let shares: Vec<f64> = crate::attempts::find(&mut c, new[0].job, 1)
            .unwrap()
            .into_iter()
            .map(|a| a.gpu_amount())
            .collect();
        assert_eq!(shares, [0.25]);
    }
}
