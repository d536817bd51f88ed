//! Events and helpers shared by the suites.

use uuid::Uuid;

use crate::event::{EventId, NewEvent, StoredEvent};

/// The namespace the suites derive event ids in.
pub fn namespace() -> Uuid {
    Uuid::from_u128(0x0b0c_5e2a_11f0_4c3e_9d6a_5d2c_7e41_a001)
}

/// A small `invoice.paid` event for `key`, numbered `n`, with a fresh id.
pub fn event(key: &str, n: usize) -> NewEvent {
    event_with_payload(key, n, serde_json::json!({ "key": key, "n": n }))
}

/// Like [`event`], with the given payload.
pub fn event_with_payload(key: &str, n: usize, payload: serde_json::Value) -> NewEvent {
    NewEvent::builder("invoice.paid", "invoice", format!("inv-{key}-{n}"))
        .event_id(EventId::random())
        .partition_key(key)
        .payload(&payload)
        .correlation_id(format!("corr-{n}"))
        .traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        .header("tenant", "acme")
        .build()
        .expect("fixture event is valid")
}

/// `total` events spread round-robin over `keys` keys (`k0`, `k1`, …), in
/// enqueue order.
pub fn events_over_keys(total: usize, keys: usize) -> Vec<NewEvent> {
    (0..total)
        .map(|n| event(&format!("k{}", n % keys), n))
        .collect()
}

/// `events` as a store would hand them to a publisher: sequences 1, 2, …,
/// created and available now, no attempts yet (for publisher tests that
/// need no store).
pub fn stored(events: Vec<NewEvent>) -> Vec<StoredEvent> {
    let now = chrono::Utc::now();
    events
        .into_iter()
        .enumerate()
        .map(|(i, event)| StoredEvent {
            sequence: i as i64 + 1,
            event,
            created_at: now,
            available_at: now,
            attempts: 0,
        })
        .collect()
}
