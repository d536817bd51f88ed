//! `outbox-sql`'s statements with their parameters bound the Diesel way,
//! and the rows they return.

use diesel::pg::Pg;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Uuid as SqlUuid};
use outbox_sql::enqueue::EnqueueColumns;
use outbox_sql::postgres::Queries;

/// The enqueue statement over the batch's columns.
pub(super) fn enqueue<'a>(
    queries: &Queries,
    columns: EnqueueColumns<'a>,
) -> BoxedSqlQuery<'a, Pg, SqlQuery> {
    diesel::sql_query(queries.enqueue.as_str())
        .into_boxed()
        .bind::<Array<SqlUuid>, _>(columns.event_ids)
        .bind::<Array<Text>, _>(columns.aggregate_types)
        .bind::<Array<Text>, _>(columns.aggregate_ids)
        .bind::<Array<Text>, _>(columns.event_types)
        .bind::<Array<Text>, _>(columns.partition_keys)
        .bind::<Array<Text>, _>(columns.payloads)
        .bind::<Array<Integer>, _>(columns.payload_versions)
        .bind::<Array<Text>, _>(columns.headers)
        .bind::<Array<Nullable<BigInt>>, _>(columns.delays_ms)
}

/// A row the enqueue inserted.
#[derive(diesel::QueryableByName)]
pub(super) struct Inserted {
    #[diesel(sql_type = SqlUuid)]
    event_id: uuid::Uuid,
    #[diesel(sql_type = BigInt)]
    sequence: i64,
}

impl Inserted {
    pub(super) fn pair(self) -> (uuid::Uuid, i64) {
        (self.event_id, self.sequence)
    }
}

/// The events table and the schema-version record, where present.
#[derive(diesel::QueryableByName)]
pub(super) struct Installed {
    #[diesel(sql_type = Nullable<Text>)]
    pub(super) events: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(super) record: Option<String>,
}

impl Installed {
    pub(super) fn both(&self) -> bool {
        self.events.is_some() && self.record.is_some()
    }
}

/// Whether `outbox_schema_applied` exists.
#[derive(diesel::QueryableByName)]
pub(super) struct AppliedTable {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub(super) present: bool,
}

/// The schema fingerprint `migrate()` last applied.
#[derive(diesel::QueryableByName)]
pub(super) struct Applied {
    #[diesel(sql_type = Nullable<Text>)]
    pub(super) fingerprint: Option<String>,
}

/// The schema-version record's version.
#[derive(diesel::QueryableByName)]
pub(super) struct InstalledVersion {
    #[diesel(sql_type = Nullable<Integer>)]
    pub(super) version: Option<i32>,
}
