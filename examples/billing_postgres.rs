//! The billing flow on PostgreSQL: `invoice.paid` and `payment.failed` move
//! a subscription's dunning stage, exactly once per event, even though the
//! broker delivers every event twice.
//!
//! `cargo run --example billing-postgres` (PostgreSQL on 127.0.0.1:5432, or
//! `OUTBOX_PG_URL`). Uses its own schema `billing_example`, recreated per run.
//! The broker is in-process here; the Kafka, SNS and Redis adapters plug in
//! as the relay's publisher.

use std::sync::Arc;
use std::time::Duration;

use outbox::memory::RecordingPublisher;
use outbox::sqlx::postgres::PgStore;
use outbox::sqlx::{StoreConfig, TableNames, guard_cancelled_transactions};
use outbox::store::OutboxAdmin;
use outbox::{CancellationToken, EventId, InboxStore, NewEvent, Relay, RelayConfig, StoredEvent};
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

const NAMESPACE: Uuid = Uuid::from_u128(0x2b8e_61f0_7d4c_4a1e_b3f5_0c9d_1e2a_6f77);
type Error = Box<dyn std::error::Error + Send + Sync>;

/// A payment attempt's outcome, written with its event in one transaction.
async fn record_payment(
    store: &PgStore,
    invoice: &str,
    attempt: &str,
    succeeded: bool,
) -> Result<EventId, Error> {
    let mut tx = store.pool().begin().await?;
    let (subscription, amount): (String, i64) = sqlx::query_as(
        "UPDATE billing_example.invoices SET status = CASE WHEN $2 THEN 'paid' ELSE status END
         WHERE id = $1 RETURNING subscription_id, amount_cents",
    )
    .bind(invoice)
    .bind(succeeded)
    .fetch_one(&mut *tx)
    .await?;
    let event_type = if succeeded {
        "invoice.paid"
    } else {
        "payment.failed"
    };
    let event = NewEvent::builder(event_type, "invoice", invoice)
        .deterministic_id(NAMESPACE, &format!("{event_type}/{attempt}"))
        .partition_key(&subscription)
        .payload(&serde_json::json!({
            "invoice_id": invoice, "subscription_id": subscription,
            "attempt": attempt, "amount_cents": amount,
        }))
        .correlation_id(format!("billing-run-{attempt}"))
        .build()?;
    store.enqueue(&mut tx, std::slice::from_ref(&event)).await?;
    tx.commit().await?;
    Ok(event.event_id)
}

/// The dunning consumer: its effect and its inbox claim commit together.
async fn dunning_consumer(store: &PgStore, delivered: &StoredEvent) -> Result<bool, Error> {
    let inbox = store.inbox();
    let mut tx = inbox.begin().await?;
    if !inbox.claim(&mut tx, "dunning", delivered.event_id).await? {
        inbox.rollback(tx).await?;
        return Ok(false);
    }
    let subscription = delivered.partition_key.as_str();
    let effect = match delivered.event_type.as_str() {
        "payment.failed" => {
            "UPDATE billing_example.subscriptions SET dunning_stage = dunning_stage + 1 WHERE id = $1"
        }
        _ => "UPDATE billing_example.subscriptions SET dunning_stage = 0 WHERE id = $1",
    };
    sqlx::query(effect)
        .bind(subscription)
        .execute(&mut *tx)
        .await?;
    inbox.commit(tx).await?;
    Ok(true)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::var("OUTBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let pool = guard_cancelled_transactions(PgPoolOptions::new())
        .max_connections(8)
        .connect(&url)
        .await?;
    sqlx::raw_sql(
        "DROP SCHEMA IF EXISTS billing_example CASCADE;
         CREATE SCHEMA billing_example;
         CREATE TABLE billing_example.subscriptions (id TEXT PRIMARY KEY, dunning_stage INT NOT NULL);
         CREATE TABLE billing_example.invoices (id TEXT PRIMARY KEY, subscription_id TEXT NOT NULL,
             amount_cents BIGINT NOT NULL, status TEXT NOT NULL);
         INSERT INTO billing_example.subscriptions VALUES ('sub-1', 0), ('sub-2', 0);
         INSERT INTO billing_example.invoices VALUES ('inv-10', 'sub-1', 2900, 'open'),
             ('inv-20', 'sub-2', 9900, 'open');",
    )
    .execute(&pool)
    .await?;
    let tables = TableNames::default().in_schema("billing_example")?;
    let store = PgStore::new(pool.clone(), StoreConfig::with_tables(tables));
    store.migrate().await?;

    println!("Renewal run: sub-1's card fails twice then succeeds; sub-2's fails once");
    for (invoice, attempt, ok) in [
        ("inv-10", "a1", false),
        ("inv-20", "b1", false),
        ("inv-10", "a2", false),
        ("inv-10", "a3", true),
    ] {
        let id = record_payment(&store, invoice, attempt, ok).await?;
        println!(
            "   {invoice} attempt {attempt}: {} ({id})",
            if ok { "paid" } else { "failed" }
        );
    }
    let lag = store.stats().await?;
    for s in &lag {
        println!(
            "   lag before the relay runs: {} {} claimable, oldest waiting {:?}",
            s.claimable, s.event_type, s.oldest_claimable_age
        );
    }

    let broker = Arc::new(RecordingPublisher::new());
    let shutdown = CancellationToken::new();
    let mut handles = Vec::new();
    for n in 1..=2 {
        let config = RelayConfig {
            relay_id: outbox::store::RelayId::new(format!("billing-relay-{n}")),
            poll_interval: Duration::from_secs(5),
            ..RelayConfig::default()
        };
        let relay = Relay::new(Arc::new(store.clone()), broker.clone(), config)?
            .with_wake_up(store.wake_up().await?);
        handles.push(relay.spawn(shutdown.clone()));
    }
    broker.wait_for_deliveries(4).await;
    shutdown.cancel();
    for handle in handles {
        handle.await??;
    }
    println!("\nTwo relays published {} events", broker.delivered().len());

    println!("\nThe dunning consumer receives every event twice (an at-least-once broker):");
    let deliveries: Vec<_> = broker
        .delivered()
        .into_iter()
        .chain(broker.delivered())
        .collect();
    for delivered in &deliveries {
        let applied = dunning_consumer(&store, delivered).await?;
        println!(
            "   {:<15} {} on {} -> {}",
            delivered.event_type,
            delivered.aggregate_id,
            delivered.partition_key,
            if applied {
                "applied"
            } else {
                "already applied"
            }
        );
    }
    let stages: Vec<(String, i32)> =
        sqlx::query_as("SELECT id, dunning_stage FROM billing_example.subscriptions ORDER BY id")
            .fetch_all(&pool)
            .await?;
    for (subscription, stage) in stages {
        println!("   {subscription}: dunning stage {stage}");
    }

    println!("\nOperations views (DESIGN.md §8):");
    for s in store.stats().await? {
        println!(
            "   {}: {} claimable (oldest {:?}), {} parked, {} in flight, {} failed",
            s.event_type, s.claimable, s.oldest_claimable_age, s.parked, s.in_flight, s.failed
        );
    }
    println!(
        "   failed events: {}",
        store.failed_events(100).await?.len()
    );
    for relay in store.relays().await? {
        println!("   relay {} last seen {}", relay.relay, relay.last_seen);
    }
    Ok(())
}
