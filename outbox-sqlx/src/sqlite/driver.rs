//! sqlx as `outbox-sql`'s SQLite driver: binds the protocol's parameters
//! and reads its rows; the protocol itself is `outbox_sql::sqlite::Protocol`.

use std::ops::DerefMut;

use async_trait::async_trait;
use outbox_core::{RawEvent, StoreError};
use outbox_sql::sqlite::{Driver, Exec, Param, Row, Value};
use sqlx::pool::PoolConnection;
use sqlx::sqlite::SqliteRow;
use sqlx::{Decode, Sqlite, SqliteConnection, SqlitePool, Transaction, TypeInfo, ValueRef};

use crate::error::ResultExt;
use crate::scalars::bind;

/// A pool as the protocol's driver.
#[derive(Clone, Debug)]
pub(crate) struct SqlxDriver(pub(crate) SqlitePool);

/// A connection (pooled, a transaction, or the caller's
/// `&mut SqliteConnection` inside their own transaction) as the protocol
/// runs statements on it.
pub(crate) struct Sqlx<C>(pub(crate) C);

impl<C> Sqlx<C> {
    /// The caller's connection (their transaction).
    pub(crate) fn caller(conn: C) -> Self {
        Self(conn)
    }
}

/// A value by the storage class it has (SQLite columns take any type):
/// INTEGER as an integer, TEXT as text, BLOB as bytes, REAL as its text.
/// Read once from the raw value (no second lookup by index, no allocation
/// but the value's own): a claim reads fifteen thousand of them.
fn value(row: &SqliteRow, index: usize) -> Result<Value, StoreError> {
    enum Class {
        Int,
        Real,
        Blob,
        Text,
    }
    let raw = sqlx::Row::try_get_raw(row, index).store()?;
    if raw.is_null() {
        return Ok(Value::Null);
    }
    let class = match raw.type_info().name() {
        "INTEGER" | "BOOLEAN" => Class::Int,
        "REAL" => Class::Real,
        "BLOB" => Class::Blob,
        _ => Class::Text,
    };
    let decoded = match class {
        Class::Int => <i64 as Decode<Sqlite>>::decode(raw).map(Value::Int),
        Class::Real => <f64 as Decode<Sqlite>>::decode(raw).map(|n| Value::Text(n.to_string())),
        Class::Blob => <Vec<u8> as Decode<Sqlite>>::decode(raw).map(Value::from_bytes),
        Class::Text => <String as Decode<Sqlite>>::decode(raw).map(Value::Text),
    };
    decoded.map_err(sqlx::Error::Decode).store()
}

/// A claimed row's token and event, typed (see `Exec::fetch_events`):
/// text columns that hold a number (SQLite columns take any type) are read
/// as its text, NULL as empty, as `outbox_sql::sqlite::raw_event` reads them.
fn event_row(row: &SqliteRow) -> Result<(i64, RawEvent), StoreError> {
    use sqlx::Row as _;
    let text = |column: &str| -> Result<String, StoreError> {
        let value = row.try_get_raw(column).store()?;
        if value.is_null() {
            return Ok(String::new());
        }
        row.try_get::<String, _>(column)
            .or_else(|_| row.try_get::<i64, _>(column).map(|n| n.to_string()))
            .or_else(|_| row.try_get::<f64, _>(column).map(|n| n.to_string()))
            .store()
    };
    let time = |column: &str| -> Result<_, StoreError> {
        outbox_sql::row::from_micros(row.try_get(column).store()?)
    };
    let event_id: String = row.try_get("event_id").store()?;
    let event = RawEvent {
        sequence: row.try_get("sequence").store()?,
        event_id: event_id
            .parse()
            .map_err(|e| StoreError::fatal(format!("stored event id {event_id:?}: {e}")))?,
        aggregate_type: text("aggregate_type")?,
        aggregate_id: text("aggregate_id")?,
        event_type: text("event_type")?,
        partition_key: text("partition_key")?,
        payload: text("payload")?,
        payload_version: row.try_get("payload_version").unwrap_or(-1),
        headers: text("headers")?,
        created_at: time("created_at")?,
        available_at: time("available_at")?,
        attempts: row.try_get("attempts").store()?,
    };
    Ok((row.try_get("fencing_token").store()?, event))
}

fn rows(rows: &[SqliteRow]) -> Result<Vec<Row>, StoreError> {
    crate::scalars::named_rows(rows, value)
}

#[async_trait]
impl<C> Exec for Sqlx<C>
where
    C: DerefMut<Target = SqliteConnection> + Send,
{
    async fn execute(&mut self, sql: &str, params: Vec<Param>) -> Result<u64, StoreError> {
        let done = bind(sql, &params).execute(&mut *self.0).await.store()?;
        Ok(done.rows_affected())
    }

    async fn fetch(&mut self, sql: &str, params: Vec<Param>) -> Result<Vec<Row>, StoreError> {
        rows(&bind(sql, &params).fetch_all(&mut *self.0).await.store()?)
    }

    async fn fetch_events(
        &mut self,
        sql: &str,
        params: Vec<Param>,
    ) -> Result<Vec<(i64, RawEvent)>, StoreError> {
        let found = bind(sql, &params).fetch_all(&mut *self.0).await.store()?;
        found.iter().map(event_row).collect()
    }

    async fn run_script(&mut self, sql: &str) -> Result<(), StoreError> {
        sqlx::Executor::execute(&mut *self.0, sqlx::raw_sql(sql))
            .await
            .store()?;
        Ok(())
    }
}

#[async_trait]
impl Driver for SqlxDriver {
    type Conn = Sqlx<PoolConnection<Sqlite>>;
    type Tx = Sqlx<Transaction<'static, Sqlite>>;

    async fn connect(&self) -> Result<Self::Conn, StoreError> {
        self.0.acquire().await.store().map(Sqlx)
    }

    async fn begin(&self) -> Result<Self::Tx, StoreError> {
        self.0.begin_with("BEGIN IMMEDIATE").await.store().map(Sqlx)
    }

    async fn commit(tx: Self::Tx) -> Result<(), StoreError> {
        tx.0.commit().await.store()
    }
}

#[cfg(test)]
mod tests {
    use outbox_core::{EventId, NewEvent};
    use outbox_sql::StoreConfig;
    use outbox_sql::sqlite::Protocol;

    use super::*;

    /// A statement runner without the typed claim read: the protocol's
    /// default through `Row`, as another driver would get it.
    struct ThroughRow<E>(E);

    #[async_trait]
    impl<E: Exec> Exec for ThroughRow<E> {
        async fn execute(&mut self, sql: &str, params: Vec<Param>) -> Result<u64, StoreError> {
            self.0.execute(sql, params).await
        }
        async fn fetch(&mut self, sql: &str, params: Vec<Param>) -> Result<Vec<Row>, StoreError> {
            self.0.fetch(sql, params).await
        }
        async fn run_script(&mut self, sql: &str) -> Result<(), StoreError> {
            self.0.run_script(sql).await
        }
    }

    /// The claim's rows read typed (this driver) and through `Row` (the
    /// default) are the same events, tokens and undecodable rows alike.
    #[tokio::test]
    async fn the_typed_claim_read_and_the_default_through_row_agree() {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .expect("an in-memory database");
        let protocol = Protocol::new(SqlxDriver(pool), StoreConfig::default()).expect("a protocol");
        protocol.migrate().await.expect("migrate");
        let events = [
            NewEvent::builder("invoice.paid", "invoice", "inv-1")
                .event_id(EventId::random())
                .payload(&serde_json::json!({"amount": 12}))
                .header("traceparent", "00-abc-def-01")
                .build()
                .expect("an event"),
            NewEvent::builder("invoice.voided", "invoice", "inv-2")
                .event_id(EventId::random())
                .payload(&"ünïcode")
                .build()
                .expect("an event"),
        ];
        let mut conn = protocol.driver.connect().await.expect("a connection");
        protocol.enqueue(&mut conn, &events).await.expect("enqueue");
        // A row another tool wrote: a header that is not a string, a
        // number where text belongs.
        conn.execute(
            "INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type,
                 partition_key, payload, payload_version, headers, created_at, available_at)
             VALUES ('9b2e6a52-3d1c-4f7e-9a43-2f0d5c1e8b10', 'bad', 7, 'bad.row', 7, '{}', 1,
                     '{\"traceparent\": 5}', 0, 0)",
            Vec::new(),
        )
        .await
        .expect("insert a row another tool wrote");
        let all = Param::Text("[1, 2, 3]".into());
        let read = &protocol.queries.read_rows;
        let typed = conn
            .fetch_events(read, vec![all.clone()])
            .await
            .expect("the typed read");
        let through_row = ThroughRow(conn)
            .fetch_events(read, vec![all])
            .await
            .expect("the read through Row");
        assert_eq!(typed.len(), 3, "{typed:?}");
        assert_eq!(typed, through_row);
        assert!(typed[2].1.clone().decode().is_err(), "the bad row decodes");
    }
}
