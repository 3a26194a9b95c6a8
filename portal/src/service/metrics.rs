//! What a scrape of `/metrics` reads fresh: job counts by lab and state from the
//! database, the agents held here, the database pool. Everything else is counted where
//! it happens.

use super::Ctx;
use crate::db::{jobs, nodes, users};
use crate::error::AppError;
use crate::metrics::{JobLabels, NodeLabels, PoolLabel};

/// Refreshes the scrape-time gauges and returns the whole registry as text.
pub async fn scrape(ctx: &Ctx) -> Result<String, AppError> {
    let (counts, labs, online) = ctx
        .db
        .run(|c| {
            Ok::<_, AppError>((
                jobs::count_by_lab_and_state(c)?,
                users::all_lab_slugs(c)?,
                nodes::online_by_node(c)?,
            ))
        })
        .await?;
    let m = &ctx.metrics;
    m.set_labs(labs);
    m.node_up.clear();
    for (node, lab, up) in online {
        m.node_up
            .get_or_create(&NodeLabels {
                node,
                lab: m.lab(lab),
            })
            .set(i64::from(up));
    }
    m.jobs.clear();
    for (lab, state, n) in counts {
        m.jobs
            .get_or_create(&JobLabels {
                lab: m.lab(lab),
                state,
            })
            .set(n);
    }
    m.agents_connected.set(ctx.agents.connected().len() as i64);
    let (open, idle, max) = ctx.db.pool_state();
    m.db_pool
        .get_or_create(&PoolLabel { state: "idle" })
        .set(i64::from(idle));
    m.db_pool
        .get_or_create(&PoolLabel { state: "in_use" })
        .set(i64::from(open.saturating_sub(idle)));
    m.db_pool_max.set(i64::from(max));
    m.count_statements(ctx.db.statements());
    Ok(m.encode())
}
