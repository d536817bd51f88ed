//! A synchronous Diesel service on PostgreSQL, end to end: request handlers
//! pay invoices on a `PgConnection` and enqueue `invoice.paid` in the same
//! Diesel transaction; the relay runs on diesel-async in a background
//! runtime; a consumer thread applies each event once on its own
//! `PgConnection` although the broker delivers every event twice.
//!
//! `cargo run --example diesel-sync --features diesel-sync` (Diesel's
//! `PgConnection` links libpq; PostgreSQL on 127.0.0.1:5432, or
//! `OUTBOX_PG_URL`). Uses its own schema `diesel_sync_example`, recreated
//! per run. The broker is an in-process channel here; the Kafka, SNS and
//! Redis adapters plug in as the relay's publisher, and their consumer
//! runners call the same `apply_once_sync` through `spawn_blocking`.
//!
//! Only `diesel::RunQueryDsl` is in scope in this file (through Diesel's
//! prelude): with diesel-async's beside it every `.execute` would be
//! ambiguous (E0034). Keep sync and async Diesel code in separate modules.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use outbox::diesel::diesel::connection::SimpleConnection;
use outbox::diesel::diesel::prelude::*;
use outbox::diesel::diesel::sql_types::{BigInt, Text};
use outbox::diesel::diesel::{self, PgConnection};
use outbox::diesel::diesel_async::AsyncPgConnection;
use outbox::diesel::diesel_async::pooled_connection::AsyncDieselConnectionManager;
use outbox::diesel::diesel_async::pooled_connection::deadpool::Pool;
use outbox::diesel::postgres::{PgOutbox, PgStore};
use outbox::diesel::{StoreConfig, TableNames};
use outbox::{
    CancellationToken, EventId, NewEvent, PublishOutcome, Publisher, Relay, RelayConfig,
    StoredEvent,
};

type Error = Box<dyn std::error::Error + Send + Sync>;

const SCHEMA: &str = "diesel_sync_example";
const INVOICES: [(&str, i64); 3] = [("inv-1", 1200), ("inv-2", 4900), ("inv-3", 700)];

/// The broker: hands each event to the consumer thread, twice (brokers
/// deliver at least once; the inbox makes the effect exactly-once).
struct TwiceDelivered(mpsc::Sender<StoredEvent>);

#[outbox::async_trait]
impl Publisher for TwiceDelivered {
    async fn publish(&self, batch: &[&StoredEvent]) -> Vec<PublishOutcome> {
        batch
            .iter()
            .map(|event| {
                for _ in 0..2 {
                    self.0
                        .send((*event).clone())
                        .map_err(|_| outbox::PublishError::outage("the consumer has gone"))?;
                }
                Ok(())
            })
            .collect()
    }
}

#[derive(QueryableByName)]
struct Revenue {
    #[diesel(sql_type = BigInt)]
    rows: i64,
    #[diesel(sql_type = BigInt)]
    cents: i64,
}

fn main() -> Result<(), Error> {
    let url = std::env::var("OUTBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut conn = PgConnection::establish(&url)?;
    conn.batch_execute(&format!(
        "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE;
         CREATE SCHEMA {SCHEMA};
         CREATE TABLE {SCHEMA}.invoices (id TEXT PRIMARY KEY, amount_cents BIGINT NOT NULL,
             status TEXT NOT NULL);
         CREATE TABLE {SCHEMA}.revenue (invoice_id TEXT NOT NULL, amount_cents BIGINT NOT NULL);
         INSERT INTO {SCHEMA}.invoices VALUES ('inv-1', 1200, 'open'), ('inv-2', 4900, 'open'),
             ('inv-3', 700, 'open');"
    ))?;
    let config = StoreConfig::with_tables(TableNames::default().in_schema(SCHEMA)?);
    let outbox = PgOutbox::new(config.clone());
    let migrated = outbox.migrate_sync(&mut conn)?;
    println!(
        "outbox tables migrated on a PgConnection (schema version {})",
        migrated.version
    );

    println!("\n1. The relay starts on diesel-async, in a background runtime");
    let runtime = tokio::runtime::Runtime::new()?;
    let pool = Pool::builder(AsyncDieselConnectionManager::<AsyncPgConnection>::new(&url))
        .max_size(4)
        .build()?;
    let store = Arc::new(PgStore::new(pool, config));
    let (deliveries, received) = mpsc::channel();
    let shutdown = CancellationToken::new();
    let relay = {
        let _in_runtime = runtime.enter();
        let relay_config = RelayConfig {
            poll_interval: Duration::from_millis(50),
            ..RelayConfig::default()
        };
        Relay::new(store, Arc::new(TwiceDelivered(deliveries)), relay_config)?
            .spawn(shutdown.clone())
    };

    println!("\n2. The consumer thread applies each delivery once, on its own PgConnection");
    let (progress, booked_so_far) = mpsc::channel();
    let consumer = std::thread::spawn({
        let (url, outbox) = (url.clone(), outbox.clone());
        move || -> Result<(usize, usize), Error> {
            let mut conn = PgConnection::establish(&url)?;
            let (mut applied, mut redelivered) = (0, 0);
            // Until the relay stops and drops the broker's sender.
            for delivery in received {
                let paid: serde_json::Value = serde_json::from_str(delivery.payload.as_str())?;
                let booked =
                    outbox.apply_once_sync(&mut conn, "revenue", delivery.event_id, |conn| {
                        diesel::sql_query(format!(
                        "INSERT INTO {SCHEMA}.revenue (invoice_id, amount_cents) VALUES ($1, $2)"
                    ))
                    .bind::<Text, _>(delivery.aggregate_id.as_str())
                    .bind::<BigInt, _>(paid["amount_cents"].as_i64().unwrap_or_default())
                    .execute(conn)?;
                        Ok::<_, outbox::diesel::Error>(())
                    })?;
                let what = if booked.is_some() {
                    applied += 1;
                    let _ = progress.send(());
                    "revenue booked with its inbox claim"
                } else {
                    redelivered += 1;
                    "a redelivery, nothing done"
                };
                println!(
                    "   {} {}: {what}",
                    delivery.event_type, delivery.aggregate_id
                );
            }
            Ok((applied, redelivered))
        }
    });

    println!("\n3. Request handlers pay invoices: the row and its event commit together");
    for (invoice, amount_cents) in INVOICES {
        let paid = NewEvent::builder("invoice.paid", "invoice", invoice)
            .event_id(EventId::random())
            .payload(&serde_json::json!({ "invoice_id": invoice, "amount_cents": amount_cents }))
            .build()?;
        conn.transaction::<_, outbox::diesel::Error, _>(|conn| {
            diesel::sql_query(format!(
                "UPDATE {SCHEMA}.invoices SET status = 'paid' WHERE id = $1"
            ))
            .bind::<Text, _>(invoice)
            .execute(conn)?;
            outbox.enqueue_sync(conn, std::slice::from_ref(&paid))?;
            Ok(())
        })?;
        println!("   {invoice} paid, {} enqueued", paid.event_id);
    }

    for _ in INVOICES {
        booked_so_far.recv_timeout(Duration::from_secs(30))?;
    }
    shutdown.cancel();
    let report = runtime.block_on(relay)??;
    let (applied, redelivered) = consumer
        .join()
        .map_err(|_| "the consumer thread panicked")??;
    println!(
        "\n4. The relay stopped: {} published; the consumer applied {applied}, skipped {redelivered} redeliveries",
        report.published
    );

    let revenue: Revenue = diesel::sql_query(format!(
        "SELECT count(*) AS rows, COALESCE(sum(amount_cents), 0)::bigint AS cents FROM {SCHEMA}.revenue"
    ))
    .get_result(&mut conn)?;
    println!(
        "\nrevenue rows: {}, total {} cents: each payment counted once",
        revenue.rows, revenue.cents
    );
    let expected_cents: i64 = INVOICES.iter().map(|(_, cents)| cents).sum();
    if report.published != 3
        || (applied, redelivered) != (3, 3)
        || (revenue.rows, revenue.cents) != (3, expected_cents)
    {
        return Err("the events were not published and applied exactly once".into());
    }
    Ok(())
}
