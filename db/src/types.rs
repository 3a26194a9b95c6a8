//! Column types that fail closed: enums stored as text and JSON stored as text.
//!
//! Reading a row whose enum text is unknown, or whose JSON does not parse into the
//! expected type, is a deserialisation error of the query (logged, and an error page or
//! a 500 for the user), never a permissive default: a damaged lending rule must not read
//! as "lend always, no limits".
//!
//! Both impls are generic over the backend, bounded on what `String`/`str` can do there,
//! so they serve SQLite, PostgreSQL and the `MultiConnection` backend alike.

use diesel::backend::Backend;
use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::sql_types::Text;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// `FromSql`/`ToSql` on `Text` for an enum with `as_str` and a fallible `FromStr`.
macro_rules! text_column {
    ($name:ty) => {
        impl<DB> diesel::deserialize::FromSql<diesel::sql_types::Text, DB> for $name
        where
            DB: diesel::backend::Backend,
            String: diesel::deserialize::FromSql<diesel::sql_types::Text, DB>,
        {
            fn from_sql(bytes: DB::RawValue<'_>) -> diesel::deserialize::Result<Self> {
                let text = <String as diesel::deserialize::FromSql<
                                                                            diesel::sql_types::Text,
                                                                            DB,
                                                                        >>::from_sql(bytes)?;
                Ok(text.parse::<$name>()?)
            }
        }

        impl<DB> diesel::serialize::ToSql<diesel::sql_types::Text, DB> for $name
        where
            DB: diesel::backend::Backend,
            str: diesel::serialize::ToSql<diesel::sql_types::Text, DB>,
        {
            fn to_sql<'b>(
                &'b self,
                out: &mut diesel::serialize::Output<'b, '_, DB>,
            ) -> diesel::serialize::Result {
                <str as diesel::serialize::ToSql<diesel::sql_types::Text, DB>>::to_sql(
                    self.as_str(),
                    out,
                )
            }
        }
    };
}
text_column!(crate::domain::JobState);
text_column!(crate::domain::AttemptStatus);
text_column!(crate::domain::Role);
text_column!(crate::domain::MembershipSource);
text_column!(crate::domain::JobKind);

/// A `Text` column holding the JSON form of `T`. Reading text that is not valid JSON for
/// `T` fails the query. Writes go through [`to_json`] (the multi-backend binds text by
/// reference, so the encoded string must outlive the query).
#[derive(Debug, Clone, PartialEq, Default, FromSqlRow)]
pub struct Json<T>(pub T);

impl<T> std::ops::Deref for Json<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Serialize> Serialize for Json<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// The column's text did not parse as the expected JSON.
#[derive(Debug, thiserror::Error)]
#[error("a stored {what} does not parse ({source}); the row is damaged: {text:.200}")]
pub struct BadJson {
    pub what: &'static str,
    pub text: String,
    #[source]
    pub source: serde_json::Error,
}

impl<T, DB> FromSql<Text, DB> for Json<T>
where
    T: DeserializeOwned,
    DB: Backend,
    String: FromSql<Text, DB>,
{
    fn from_sql(bytes: DB::RawValue<'_>) -> deserialize::Result<Self> {
        let text = <String as FromSql<Text, DB>>::from_sql(bytes)?;
        serde_json::from_str(&text).map(Json).map_err(|source| {
            Box::new(BadJson {
                what: std::any::type_name::<T>(),
                text,
                source,
            }) as Box<dyn std::error::Error + Send + Sync>
        })
    }
}

/// The text to store in a JSON column.
pub fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<String, serde_json::Error> {
    serde_json::to_string(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::JobState;
    use crate::{establish, DbConn};
    use diesel::prelude::*;
    use diesel::sql_types::Text;

    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        v: JobState,
    }

    #[derive(QueryableByName)]
    struct JsonRow {
        #[diesel(sql_type = Text)]
        v: Json<commons_sched::Lending>,
    }

    fn conn() -> DbConn {
        establish("sqlite://:memory:").unwrap()
    }

    #[test]
    fn unknown_enum_text_is_an_error_not_a_default() {
        let mut c = conn();
        let ok: Row = diesel::sql_query("SELECT 'running' AS v")
            .get_result(&mut c)
            .unwrap();
        assert_eq!(ok.v, JobState::Running);
        let bad = diesel::sql_query("SELECT 'finished' AS v").get_result::<Row>(&mut c);
        let e = bad.err().expect("unknown state refused").to_string();
        assert!(e.contains("not a known job state"), "{e}");
    }

    #[test]
    fn damaged_json_is_an_error_not_lend_always() {
        let mut c = conn();
        let ok: JsonRow = diesel::sql_query(r#"SELECT '{"mode":"never"}' AS v"#)
            .get_result(&mut c)
            .unwrap();
        assert_eq!(ok.v.mode, commons_sched::LendMode::Never);
        for damaged in [r#"{"mode":"nevr"}"#, "{", r#"{"max_lent_gpus":-1}"#] {
            let q = format!("SELECT '{damaged}' AS v");
            let bad = diesel::sql_query(q).get_result::<JsonRow>(&mut c);
            let e = bad.err().expect("damaged JSON refused").to_string();
            assert!(e.contains("does not parse"), "{damaged}: {e}");
        }
    }
}
