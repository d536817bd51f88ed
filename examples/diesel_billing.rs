//! The billing flow for a Diesel application on PostgreSQL: paying an
//! invoice and enqueueing `invoice.paid` commit in one Diesel transaction,
//! a relay publishes, and a Diesel consumer applies the event once even
//! though the broker delivers it twice.
//!
//! `cargo run --example diesel-billing` (PostgreSQL on 127.0.0.1:5432, or
//! `OUTBOX_PG_URL`). Uses its own schema `diesel_billing_example`,
//! recreated per run. The broker is in-process here; the Kafka, SNS and
//! Redis adapters plug in as the relay's publisher.

use std::sync::Arc;
use std::time::Duration;

use outbox::diesel::diesel;
use outbox::diesel::diesel::sql_types::{BigInt, Text};
use outbox::diesel::diesel_async::pooled_connection::AsyncDieselConnectionManager;
use outbox::diesel::diesel_async::pooled_connection::deadpool::Pool;
use outbox::diesel::diesel_async::{
    AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection,
};
use outbox::diesel::postgres::PgStore;
use outbox::diesel::{StoreConfig, TableNames};
use outbox::memory::RecordingPublisher;
use outbox::{CancellationToken, EventId, InboxStore, NewEvent, Relay, RelayConfig};

type Error = Box<dyn std::error::Error + Send + Sync>;

const SCHEMA: &str = "diesel_billing_example";

#[derive(diesel::QueryableByName)]
struct Revenue {
    #[diesel(sql_type = BigInt)]
    rows: i64,
    #[diesel(sql_type = BigInt)]
    cents: i64,
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::var("OUTBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let pool = Pool::builder(AsyncDieselConnectionManager::<AsyncPgConnection>::new(url))
        .max_size(4)
        .build()?;
    let mut conn = pool.get().await?;
    conn.batch_execute(&format!(
        "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE;
         CREATE SCHEMA {SCHEMA};
         CREATE TABLE {SCHEMA}.invoices (id TEXT PRIMARY KEY, amount_cents BIGINT NOT NULL,
             status TEXT NOT NULL);
         CREATE TABLE {SCHEMA}.revenue (invoice_id TEXT NOT NULL, amount_cents BIGINT NOT NULL);
         INSERT INTO {SCHEMA}.invoices VALUES ('inv-42', 1200, 'open');"
    ))
    .await?;
    let store = PgStore::new(
        pool.clone(),
        StoreConfig::with_tables(TableNames::default().in_schema(SCHEMA)?),
    );
    let migrated = store.migrate().await?;
    println!(
        "outbox tables migrated (schema version {})",
        migrated.version
    );

    println!("\n1. Paying inv-42: the invoice row and its event commit in one Diesel transaction");
    let paid = NewEvent::builder("invoice.paid", "invoice", "inv-42")
        .event_id(EventId::random())
        .payload(&serde_json::json!({ "invoice_id": "inv-42", "amount_cents": 1200 }))
        .build()?;
    let outbox = store.outbox();
    conn.transaction::<_, outbox::diesel::Error, _>(async |conn| {
        diesel::sql_query(format!(
            "UPDATE {SCHEMA}.invoices SET status = 'paid' WHERE id = $1"
        ))
        .bind::<Text, _>("inv-42")
        .execute(&mut *conn)
        .await?;
        outbox.enqueue(conn, std::slice::from_ref(&paid)).await?;
        Ok(())
    })
    .await?;
    drop(conn);
    println!("   enqueued {}", paid.event_id);

    println!("\n2. A relay over the Diesel store publishes it");
    let broker = Arc::new(RecordingPublisher::new());
    let shutdown = CancellationToken::new();
    let config = RelayConfig {
        poll_interval: Duration::from_millis(50),
        ..RelayConfig::default()
    };
    let relay =
        Relay::new(Arc::new(store.clone()), broker.clone(), config)?.spawn(shutdown.clone());
    tokio::time::timeout(Duration::from_secs(30), broker.wait_for_deliveries(1)).await?;
    shutdown.cancel();
    let report = relay.await??;
    println!("   published {}", report.published);

    println!("\n3. The broker delivers it twice; the Diesel consumer applies it once");
    let inbox = store.inbox();
    let delivered = broker.delivered()[0].clone();
    let mut applied = 0;
    for delivery in 1..=2 {
        let mut tx = inbox.begin().await?;
        if !inbox.claim(&mut tx, "revenue", delivered.event_id).await? {
            inbox.rollback(tx).await?;
            println!("   delivery {delivery}: a duplicate, nothing done");
            continue;
        }
        let body: serde_json::Value = serde_json::from_str(delivered.payload.as_str())?;
        diesel::sql_query(format!(
            "INSERT INTO {SCHEMA}.revenue (invoice_id, amount_cents) VALUES ($1, $2)"
        ))
        .bind::<Text, _>(delivered.aggregate_id.as_str())
        .bind::<BigInt, _>(body["amount_cents"].as_i64().unwrap_or_default())
        .execute(&mut *tx)
        .await?;
        inbox.commit(tx).await?;
        applied += 1;
        println!("   delivery {delivery}: revenue booked with its inbox claim");
    }

    let mut conn = pool.get().await?;
    let revenue: Revenue = diesel::sql_query(format!(
        "SELECT count(*) AS rows, COALESCE(sum(amount_cents), 0)::bigint AS cents FROM {SCHEMA}.revenue"
    ))
    .get_result(&mut conn)
    .await?;
    println!(
        "\nrevenue rows: {}, total {} cents: the payment counted once",
        revenue.rows, revenue.cents
    );
    if report.published != 1 || applied != 1 || revenue.rows != 1 || revenue.cents != 1200 {
        return Err("the event was not published and applied exactly once".into());
    }
    Ok(())
}
