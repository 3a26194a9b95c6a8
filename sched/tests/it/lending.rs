//! Lending rules per node, table-driven: one guest job against one node of another lab.

use crate::support::*;
use commons_sched::*;

/// Monday 00:00 UTC.
const MONDAY: Time = NOW - 12 * H;

fn case(lending: Lending, now: Time, tweak: impl Fn(&mut Snapshot)) -> Plan {
    let mut n = node(1, 1, 10, 2, "A100", 80);
    n.lending = lending;
    let mut s = snap(vec![n], vec![], vec![job(1, 2, 20, 1)]);
    tweak(&mut s);
    plan(&s, &Policy::default(), now)
}

#[test]
fn lending_table() {
    let nights = Lending {
        mode: LendMode::Windows,
        windows: WeeklyWindow::daily(&[0, 1, 2, 3, 4, 5, 6], 20 * 60, 8 * 60),
        ..Default::default()
    };
    let none = |_: &mut Snapshot| {};
    type Tweak = Box<dyn Fn(&mut Snapshot)>;
    let cases: Vec<(&str, Lending, Time, Tweak, Option<&str>)> = vec![
        ("always lends", Lending::default(), NOW, Box::new(none), None),
        (
            "never lends",
            Lending {
                mode: LendMode::Never,
                ..Default::default()
            },
            NOW,
            Box::new(none),
            Some("not lent: node n1 does not lend its GPUs"),
        ),
        (
            "nights, at noon",
            nights.clone(),
            NOW,
            Box::new(none),
            Some("not lent: node n1 lends only in its time windows, and none is open now"),
        ),
        ("nights, at 21:00", nights.clone(), MONDAY + 21 * H, Box::new(none), None),
        (
            "nights, 1-h job at 07:30",
            nights.clone(),
            MONDAY + 7 * H + 1800,
            Box::new(none),
            Some("not lent: node n1 lends only in time windows, and a job of 1 h would not end before the current one closes"),
        ),
        (
            "at most 1 GPU lent, 1 lent",
            Lending {
                max_lent_gpus: Some(1),
                ..Default::default()
            },
            NOW,
            Box::new(|s: &mut Snapshot| s.running.push(run(100, 3, 1, &[10], NOW - H))),
            Some("not lent: node n1 already lends its limit of 1 GPUs"),
        ),
        (
            "idle 30 min required, idle 10",
            Lending {
                min_idle_s: 30 * 60,
                ..Default::default()
            },
            NOW,
            Box::new(|s: &mut Snapshot| {
                for g in &mut s.nodes[0].gpus {
                    g.idle_since = NOW - 600;
                }
            }),
            Some("not lent: node n1 lends a GPU only after it was idle 30 min"),
        ),
        (
            "idle 30 min required, idle 1 h",
            Lending {
                min_idle_s: 30 * 60,
                ..Default::default()
            },
            NOW,
            Box::new(|s: &mut Snapshot| {
                for g in &mut s.nodes[0].gpus {
                    g.idle_since = NOW - H;
                }
            }),
            None,
        ),
        (
            "guest jobs of at most 30 min",
            Lending {
                max_guest_time_limit_s: Some(1800),
                ..Default::default()
            },
            NOW,
            Box::new(none),
            Some("not lent: node n1 lends only to jobs of at most 30 min"),
        ),
        (
            "lends to lab 3 only",
            Lending {
                borrowers: vec![3],
                ..Default::default()
            },
            NOW,
            Box::new(none),
            Some("not lent: node n1 does not lend to your lab"),
        ),
        (
            "lends to lab 2",
            Lending {
                borrowers: vec![2, 3],
                ..Default::default()
            },
            NOW,
            Box::new(none),
            None,
        ),
    ];
    for (name, lending, now, tweak, want) in cases {
        let p = case(lending, now, tweak);
        match want {
            None => assert_eq!(started(&p), vec![1], "{name}: {p:?}"),
            Some(text) => {
                assert!(p.start.is_empty(), "{name}: {p:?}");
                assert_eq!(reason(&p, 1).to_string(), text, "{name}");
            }
        }
    }
}

#[test]
fn lending_rules_do_not_bind_the_owner() {
    let mut n = node(1, 1, 10, 2, "A100", 80);
    n.lending = Lending {
        mode: LendMode::Never,
        min_idle_s: 10 * H,
        ..Default::default()
    };
    n.gpus[0].idle_since = NOW;
    let s = snap(vec![n], vec![], vec![job(1, 1, 10, 2)]);
    assert_eq!(started(&plan(&s, &Policy::default(), NOW)), vec![1]);
}

#[test]
fn windows_use_the_campus_utc_offset() {
    let mut n = node(1, 1, 10, 1, "A100", 80);
    n.lending = Lending {
        mode: LendMode::Windows,
        windows: WeeklyWindow::daily(&[0], 12 * 60 + 30, 14 * 60),
        ..Default::default()
    };
    let s = snap(vec![n], vec![], vec![job(1, 2, 20, 1)]);
    // 12:00 UTC is 13:00 in UTC+1: inside 12:30-14:00 local, and a 1-h job ends at 14:00.
    let cet = Policy {
        utc_offset_s: 3600,
        ..Default::default()
    };
    assert_eq!(started(&plan(&s, &cet, NOW)), vec![1]);
    assert!(plan(&s, &Policy::default(), NOW).start.is_empty());
}

/// A node whose agent reports more GPUs, or other models, than it enrolled with takes no
/// guest until its lab admin approves them; its own lab's jobs run there, and a guest
/// already running is not stopped for it.
#[test]
fn unapproved_gpus_take_no_guests_but_the_owners_jobs() {
    let mut n = node(1, 1, 10, 2, "A100", 80);
    n.inventory_unapproved = true;
    let guest = snap(vec![n.clone()], vec![], vec![job(1, 2, 20, 1)]);
    let p = plan(&guest, &Policy::default(), NOW);
    assert!(p.start.is_empty(), "{p:?}");
    assert_eq!(
        reason(&p, 1).to_string(),
        "not lent: node n1 reports GPUs its lab admin has not approved yet, so it takes no guests"
    );
    let owner = snap(vec![n.clone()], vec![], vec![job(2, 1, 10, 2)]);
    assert_eq!(started(&plan(&owner, &Policy::default(), NOW)), vec![2]);
    let running = snap(vec![n.clone()], vec![run(3, 2, 1, &[10], NOW - H)], vec![]);
    let p = plan(&running, &Policy::default(), NOW);
    assert!(p.preempt.is_empty(), "{p:?}");
    n.inventory_unapproved = false;
    let approved = snap(vec![n], vec![], vec![job(1, 2, 20, 1)]);
    assert_eq!(started(&plan(&approved, &Policy::default(), NOW)), vec![1]);
}
