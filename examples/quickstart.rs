//! The outbox in one run, on SQLite: no server needed.
//!
//! `cargo run --example quickstart`. Its only crates are `outbox` (feature
//! `sqlx-sqlite`; `uuid`, `serde_json` and `sqlx` come through it), `serde`
//! for the event type and `tokio`.
//!
//! 1. Paying an invoice writes `invoice.paid` in the same transaction.
//! 2. A rolled-back payment leaves no event behind.
//! 3. Replaying a payment is a reported no-op (deterministic event ids).
//! 4. A relay crashes after publishing, before acknowledging: the events are
//!    published again, and the consumer's inbox applies each once.
//! 5. An event the broker refuses for good lands in `failed`, with history.

use std::sync::Arc;
use std::time::Duration;

use outbox::memory::{Fault, RecordingPublisher};
use outbox::relay::{FailedAlert, RelayId};
use outbox::sqlx::sqlite::SqliteStore;
use outbox::sqlx::{StoreConfig, sqlx};
use outbox::store::{EnqueueOutcome, OutboxAdmin};
use outbox::uuid::Uuid;
use outbox::{
    CancellationToken, ErrorClass, EventId, InboxStore, NewEvent, Relay, RelayConfig, TypedEvent,
};
use serde::Serialize;

/// Ids of our events live in this namespace (any fixed UUID of yours).
const NAMESPACE: Uuid = Uuid::from_u128(0x5f1d_0c3a_8b7e_4e2f_9a61_2c4d_8e0b_71a5);

#[derive(Serialize)]
struct InvoicePaid {
    invoice_id: String,
    subscription_id: String,
    payment_id: String,
    amount_cents: i64,
}

impl TypedEvent for InvoicePaid {
    const EVENT_TYPE: &'static str = "invoice.paid";
    const AGGREGATE_TYPE: &'static str = "invoice";
    fn aggregate_id(&self) -> String {
        self.invoice_id.clone()
    }
    fn discriminator(&self) -> String {
        self.payment_id.clone()
    }
    fn partition_key(&self) -> Option<String> {
        Some(self.subscription_id.clone())
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The business transaction: mark the invoice paid and enqueue the event,
/// committed (or rolled back) together.
async fn pay(
    store: &SqliteStore,
    invoice: &str,
    payment: &str,
    commit: bool,
) -> Result<(EventId, EnqueueOutcome), Error> {
    let mut tx = store.begin_immediate().await?;
    let (subscription, amount): (String, i64) =
        sqlx::query_as("SELECT subscription_id, amount_cents FROM invoices WHERE id = ?1")
            .bind(invoice)
            .fetch_one(&mut *tx)
            .await?;
    sqlx::query("UPDATE invoices SET status = 'paid', payment_id = ?2 WHERE id = ?1")
        .bind(invoice)
        .bind(payment)
        .execute(&mut *tx)
        .await?;
    let event = NewEvent::from_typed(
        &InvoicePaid {
            invoice_id: invoice.into(),
            subscription_id: subscription,
            payment_id: payment.into(),
            amount_cents: amount,
        },
        NAMESPACE,
    )?;
    let outcome = store.enqueue(&mut tx, std::slice::from_ref(&event)).await?[0];
    if commit {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok((event.event_id, outcome))
}

fn relay_config(name: &str) -> RelayConfig {
    RelayConfig {
        relay_id: RelayId::new(name),
        lease_duration: Duration::from_secs(2),
        publish_timeout: Duration::from_secs(1),
        poll_interval: Duration::from_millis(100),
        ..RelayConfig::default()
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let path = std::env::temp_dir().join("outbox-quickstart.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let store = SqliteStore::open(&path.to_string_lossy(), StoreConfig::default()).await?;
    store.migrate().await?;
    sqlx::raw_sql(
        "CREATE TABLE invoices (id TEXT PRIMARY KEY, subscription_id TEXT NOT NULL,
             amount_cents INTEGER NOT NULL, status TEXT NOT NULL, payment_id TEXT);
         INSERT INTO invoices VALUES ('inv-1', 'sub-a', 1200, 'open', NULL),
             ('inv-2', 'sub-b', 4900, 'open', NULL), ('inv-3', 'sub-c', 990, 'open', NULL),
             ('inv-4', 'sub-a', 1500, 'open', NULL);
         CREATE TABLE revenue (event_id TEXT PRIMARY KEY, invoice_id TEXT NOT NULL,
             amount_cents INTEGER NOT NULL);",
    )
    .execute(store.pool())
    .await?;
    println!(
        "SQLite database at {} (outbox tables migrated)\n",
        path.display()
    );

    println!("1. Paying invoices: each payment and its event commit in one transaction");
    let mut ids = Vec::new();
    for (invoice, payment) in [("inv-1", "pay-1"), ("inv-2", "pay-2"), ("inv-3", "pay-3")] {
        let (id, outcome) = pay(&store, invoice, payment, true).await?;
        println!("   {invoice} paid; invoice.paid {id} written ({outcome:?})");
        ids.push(id);
    }

    println!("\n2. A payment that rolls back leaves no event behind");
    let (ghost, _) = pay(&store, "inv-4", "pay-4", false).await?;
    let state = store.event_state(ghost).await?;
    println!(
        "   inv-4 rolled back; its event {ghost} is in the outbox: {}",
        state.is_some()
    );

    println!("\n3. Replaying a payment produces the same event id: a reported no-op");
    let (replayed, outcome) = pay(&store, "inv-1", "pay-1", true).await?;
    println!("   inv-1/pay-1 again -> {replayed} ({outcome:?})");

    let broker = Arc::new(RecordingPublisher::new());
    broker.inject(ids[1], Fault::DeliverThenHang);
    broker.inject(ids[2], Fault::FailAlways(ErrorClass::Permanent));

    println!("\n4. Relay 1 publishes, then crashes before acknowledging");
    let first = Relay::new(
        Arc::new(store.clone()),
        broker.clone(),
        relay_config("relay-1"),
    )?
    .spawn(CancellationToken::new());
    broker.wait_for_deliveries(2).await;
    first.abort();
    let _ = first.await;
    println!(
        "   broker received {} events; relay 1 died holding their leases",
        broker.delivered().len()
    );
    broker.clear(ids[1]);

    let (alerts, mut alerted) = tokio::sync::mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let second = Relay::new(
        Arc::new(store.clone()),
        broker.clone(),
        relay_config("relay-2"),
    )?
    .with_alert_hook(move |alert: &FailedAlert| {
        let _ = alerts.send(alert.clone());
    })
    .spawn(shutdown.clone());
    println!("   relay 2 waits for those leases to expire (2 s), then re-publishes");
    broker.wait_for_deliveries(4).await;
    let alert = alerted.recv().await.expect("the poison event is reported");
    shutdown.cancel();
    let report = second.await??;
    println!(
        "   relay 2: {} published, {} failed; broker received {} deliveries in all",
        report.published,
        report.failed,
        broker.delivered().len()
    );

    println!("\n   The consumer applies each delivery through its inbox:");
    let inbox = store.inbox();
    for delivered in broker.delivered() {
        let mut tx = inbox.begin().await?;
        let fresh = inbox.claim(&mut tx, "revenue", delivered.event_id).await?;
        if fresh {
            let paid: outbox::serde_json::Value = delivered.payload.deserialize()?;
            sqlx::query("INSERT INTO revenue VALUES (?1, ?2, ?3)")
                .bind(delivered.event_id.to_string())
                .bind(paid["invoice_id"].as_str())
                .bind(paid["amount_cents"].as_i64())
                .execute(&mut *tx)
                .await?;
        }
        inbox.commit(tx).await?;
        let verdict = if fresh {
            "applied"
        } else {
            "duplicate, skipped"
        };
        println!(
            "   {} {} -> {verdict}",
            delivered.event_type, delivered.aggregate_id
        );
    }
    let (rows, cents): (i64, i64) =
        sqlx::query_as("SELECT count(*), COALESCE(sum(amount_cents), 0) FROM revenue")
            .fetch_one(store.pool())
            .await?;
    println!("   revenue rows: {rows}, total {cents} cents: each payment counted once");

    println!("\n5. The event the broker refused for good is in `failed`, with its history");
    println!(
        "   alert: {} {} ({:?}): {}",
        alert.event.event_type, alert.event.aggregate_id, alert.cause, alert.error
    );
    for failed in store.failed_events(10).await? {
        for entry in &failed.history {
            println!(
                "   history of {}: {:?} by {} at {}: {}",
                failed.event.aggregate_id, entry.kind, entry.actor, entry.at, entry.detail
            );
        }
    }
    for stats in store.stats().await? {
        println!(
            "   {}: {} claimable, {} in flight, {} failed",
            stats.event_type, stats.claimable, stats.in_flight, stats.failed
        );
    }
    Ok(())
}
