//! Lab datasets: the queries. The rules (who may register, see and mount which) are in
//! `service::datasets`; the shapes in `commons_api::datasets`.
//!
//! Invariant: one dataset per (lab, `name`), by a UNIQUE constraint; a second one of the
//! same name is reported as `None`, never as an internal error.

use super::schema::{datasets, labs, nodes};
use super::types::{to_json, Json};
use super::{now, DbConn, DbError};
use commons_api::datasets::{DatasetRequest, Visibility};
use commons_proto::NodeDatasets;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};

/// A stored dataset.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable)]
#[diesel(table_name = datasets)]
pub struct DatasetRow {
    pub id: i64,
    pub lab_id: i64,
    pub name: String,
    pub source: String,
    pub description: String,
    /// `lab`, `campus`, or a JSON list of slugs.
    pub visibility: String,
    pub created_by: String,
    pub created_at: chrono::NaiveDateTime,
}

impl DatasetRow {
    pub fn visibility(&self) -> Visibility {
        serde_json::from_str::<Vec<String>>(&self.visibility)
            .map(Visibility::Labs)
            .unwrap_or_else(|_| Visibility::Word(self.visibility.clone()))
    }
}

fn visibility_text(v: &Visibility) -> String {
    match v {
        Visibility::Word(w) => w.clone(),
        Visibility::Labs(l) => serde_json::to_string(l).unwrap_or_default(),
    }
}

/// Stores a registration; `None` when the lab has one of that name.
pub fn insert(
    c: &mut DbConn,
    lab: i64,
    req: &DatasetRequest,
    by: &str,
) -> Result<Option<DatasetRow>, DbError> {
    let q = diesel::insert_into(datasets::table).values((
        datasets::lab_id.eq(lab),
        datasets::name.eq(&req.name),
        datasets::source.eq(&req.source),
        datasets::description.eq(&req.description),
        datasets::visibility.eq(visibility_text(&req.visibility)),
        datasets::created_by.eq(by),
        datasets::created_at.eq(now()),
    ));
    let got = match c {
        DbConn::Pg(c) => q.returning(DatasetRow::as_returning()).get_result(c),
        DbConn::Sqlite(c) => q.returning(DatasetRow::as_returning()).get_result(c),
    };
    match got {
        Ok(row) => Ok(Some(row)),
        Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Every dataset with its lab's slug, by lab and name.
pub fn all(c: &mut DbConn) -> Result<Vec<(DatasetRow, String)>, DbError> {
    Ok(datasets::table
        .inner_join(labs::table)
        .select((DatasetRow::as_select(), labs::slug))
        .order((labs::slug, datasets::name))
        .load(c)?)
}

/// One dataset by lab slug and name, with its lab's id.
pub fn find(c: &mut DbConn, lab: &str, name: &str) -> Result<Option<DatasetRow>, DbError> {
    Ok(datasets::table
        .inner_join(labs::table)
        .filter(labs::slug.eq(lab))
        .filter(datasets::name.eq(name))
        .select(DatasetRow::as_select())
        .first(c)
        .optional()?)
}

/// Removes one; whether it was there. Jobs that name it fail at their next start.
pub fn delete(c: &mut DbConn, lab: i64, name: &str) -> Result<bool, DbError> {
    let n = diesel::delete(
        datasets::table
            .filter(datasets::lab_id.eq(lab))
            .filter(datasets::name.eq(name)),
    )
    .execute(c)?;
    Ok(n > 0)
}

/// Records what a node's agent said it offers.
pub fn set_node(c: &mut DbConn, node: i64, offer: &NodeDatasets) -> Result<(), DbError> {
    diesel::update(nodes::table.find(node))
        .set(nodes::datasets.eq(to_json(offer)?))
        .execute(c)?;
    Ok(())
}

/// Every live node's lab, name, online flag and offer.
pub fn node_offers(c: &mut DbConn) -> Result<Vec<(i64, String, bool, NodeDatasets)>, DbError> {
    let rows: Vec<(i64, String, bool, Json<NodeDatasets>)> = nodes::table
        .filter(nodes::revoked_at.is_null())
        .select((nodes::lab_id, nodes::name, nodes::online, nodes::datasets))
        .order(nodes::name)
        .load(c)?;
    Ok(rows
        .into_iter()
        .map(|(l, n, o, d)| (l, n, o, d.0))
        .collect())
}
