//! What read commands print: one JSON value per answer (`--output json`)
//! and lines for people built from the same value where that reads well.

use outbox_core::chrono::{DateTime, Utc};
use outbox_core::store::{
    BlockedKey, EventTypeStats, FailedEvent, HeldBack, OpenTransaction, RelayOutage, RelayStatus,
};
use serde_json::{Value, json};

/// One event type's counts.
pub fn stats(stats: &EventTypeStats) -> Value {
    json!({
        "event_type": stats.event_type,
        "claimable": stats.claimable,
        "oldest_claimable_age_seconds": stats.oldest_claimable_age.map(|a| a.as_secs_f64()),
        "parked": stats.parked,
        "blocked": stats.blocked,
        "in_flight": stats.in_flight,
        "failed": stats.failed,
    })
}

/// One cause that holds publication back, with a one-line description.
pub fn held_back(cause: &HeldBack) -> Value {
    let (kind, detail, fields) = match cause {
        HeldBack::BlockedKeys { keys, waiting } => (
            "blocked_keys",
            format!("{keys} keys blocked by failed events, {waiting} events waiting behind them"),
            json!({ "keys": keys, "waiting": waiting }),
        ),
        HeldBack::BackingOff {
            keys,
            waiting,
            next_due,
        } => (
            "backing_off",
            format!(
                "{keys} keys in retry backoff or delay, {waiting} events waiting; next due {next_due}"
            ),
            json!({ "keys": keys, "waiting": waiting, "next_due": next_due }),
        ),
        HeldBack::ExpiredLeases {
            leases,
            events,
            first_expired_at,
        } => (
            "expired_leases",
            format!(
                "{leases} expired leases hold {events} events since {first_expired_at} (are relays running?)"
            ),
            json!({ "leases": leases, "events": events, "first_expired_at": first_expired_at }),
        ),
        HeldBack::LongLeases {
            owners,
            events,
            oldest_claimed_at,
            first_expires_at,
        } => (
            "long_leases",
            format!(
                "leases held long by {} ({events} events, claimed {oldest_claimed_at}, expiring {first_expires_at})",
                owners.join(", ")
            ),
            json!({
                "owners": owners,
                "events": events,
                "oldest_claimed_at": oldest_claimed_at,
                "first_expires_at": first_expires_at,
            }),
        ),
        HeldBack::CrashSuspects { events } => (
            "crash_suspects",
            format!(
                "{events} events were in flight when a relay crashed or its lease expired (retried in shrinking groups until the crash is pinned on one)"
            ),
            json!({ "events": events }),
        ),
        HeldBack::OpenTransactions { transactions } => (
            "open_transactions",
            format!(
                "{} open transactions wrote outbox rows; oldest: {}",
                transactions.len(),
                transactions.first().map(transaction).unwrap_or_default()
            ),
            json!({ "transactions": transactions.iter().map(transaction_json).collect::<Vec<_>>() }),
        ),
        other => ("other", format!("{other:?}"), json!({})),
    };
    json!({ "kind": kind, "detail": detail, "fields": fields })
}

fn transaction(t: &OpenTransaction) -> String {
    format!(
        "pid {} on {} since {} ({})",
        t.pid, t.database, t.started_at, t.state
    )
}

fn transaction_json(t: &OpenTransaction) -> Value {
    json!({
        "pid": t.pid,
        "database": t.database,
        "started_at": t.started_at,
        "state": t.state,
        "query_started_at": t.query_started_at,
    })
}

/// A key parked behind a failed event.
pub fn blocked_key(key: &BlockedKey) -> Value {
    json!({
        "partition_key": key.partition_key,
        "blocking_event_id": key.blocking_event_id.to_string(),
        "backlog": key.backlog,
    })
}

/// A relay that reported within this long speaks for the broker now
/// (`status` and the dashboard list the outages of such relays as holding
/// publication back; `health --relay-timeout` defaults to the same).
pub const LIVE_RELAY_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// Everything that holds publication back, one value per cause: a broker
/// outage first (it holds back everything its relays would publish, so it
/// is what to fix first), then the store's causes.
pub fn held_back_lines(
    held_back: &[HeldBack],
    relays: &[RelayStatus],
    now: DateTime<Utc>,
) -> Vec<Value> {
    let mut lines = outages(relays, now, LIVE_RELAY_WITHIN.as_secs_f64());
    lines.extend(held_back.iter().map(self::held_back));
    lines
}

/// A relay's last heartbeat, and how long ago it was at `now`; its
/// publisher outage, if it is paused by one.
pub fn relay(relay: &RelayStatus, now: DateTime<Utc>) -> Value {
    json!({
        "relay": relay.relay,
        "last_seen": relay.last_seen,
        "silent_s": silent_for(relay, now),
        "clock_skew_ms": relay.clock_skew.num_milliseconds(),
        "outage": relay.outage.as_ref().map(|o| json!({
            "destination": o.destination,
            "reason": o.reason,
            "since": o.since,
            "for_s": seconds_since(o.since, now),
        })),
    })
}

/// Publishing paused by broker outages, one entry per destination, from
/// the relays that reported within `live_within` seconds (a relay that
/// stopped reporting says nothing about the broker now).
pub fn outages(relays: &[RelayStatus], now: DateTime<Utc>, live_within: f64) -> Vec<Value> {
    let mut by_destination: Vec<(&RelayOutage, Vec<&str>)> = Vec::new();
    for relay in relays.iter().filter(|r| silent_for(r, now) <= live_within) {
        let Some(outage) = &relay.outage else {
            continue;
        };
        match by_destination
            .iter_mut()
            .find(|(o, _)| o.destination == outage.destination)
        {
            Some((first, names)) => {
                if outage.since < first.since {
                    *first = outage;
                }
                names.push(&relay.relay);
            }
            None => by_destination.push((outage, vec![&relay.relay])),
        }
    }
    by_destination
        .into_iter()
        .map(|(outage, relays)| {
            json!({
                "kind": "publisher_outage",
                "detail": format!(
                    "publishing to {} paused since {} ({:.0} s): {} (relays: {})",
                    outage.destination,
                    outage.since.format("%Y-%m-%d %H:%M:%S UTC"),
                    seconds_since(outage.since, now),
                    outage.reason,
                    relays.join(", ")
                ),
                "fields": {
                    "destination": outage.destination,
                    "reason": outage.reason,
                    "since": outage.since,
                    "relays": relays,
                },
            })
        })
        .collect()
}

fn seconds_since(at: DateTime<Utc>, now: DateTime<Utc>) -> f64 {
    ((now - at).num_milliseconds().max(0) as f64) / 1000.0
}

/// Seconds since the relay's last heartbeat, on this host's clock (as
/// `health --relay-timeout` measures it); never negative.
pub fn silent_for(relay: &RelayStatus, now: DateTime<Utc>) -> f64 {
    seconds_since(relay.last_seen, now)
}

/// How much of a failed event to print.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// One line's worth: ids, type, key, attempts, the last error.
    Summary,
    /// The event's metadata and its history; the payload's size only.
    Metadata,
    /// The metadata, the history and the payload.
    WithPayload,
}

/// A failed event, in as much detail as asked.
pub fn failed(failed: &FailedEvent, detail: Detail) -> Value {
    let stored = &failed.event;
    let event = &stored.event;
    let mut value = json!({
        "event_id": event.event_id.to_string(),
        "event_type": event.event_type,
        "partition_key": event.partition_key,
        "attempts": stored.attempts,
        "created_at": stored.created_at,
        "blocks_key": failed.blocks_key,
        "superseded_by": failed.superseded_by.map(|id| id.to_string()),
        "last_error": failed.history.last().map(|h| h.detail.clone()),
    });
    if detail == Detail::Summary {
        return value;
    }
    value["event"] = json!({
        "sequence": stored.sequence,
        "aggregate_type": event.aggregate_type,
        "aggregate_id": event.aggregate_id,
        "payload_version": event.payload_version,
        "payload_bytes": event.payload.len(),
        "headers": event.headers.iter().collect::<std::collections::BTreeMap<_, _>>(),
        "available_at": stored.available_at,
    });
    value["history"] = serde_json::to_value(&failed.history).unwrap_or(Value::Null);
    if detail == Detail::WithPayload {
        value["payload"] = serde_json::from_str(event.payload.as_str()).unwrap_or(Value::Null);
    }
    value
}

/// `failed show` for people: the metadata, then the history one line per
/// entry, then the payload if asked.
pub fn failed_text(failed: &FailedEvent, detail: Detail) -> String {
    use std::fmt::Write;
    let stored = &failed.event;
    let event = &stored.event;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "event {}  {}  key {:?}  aggregate {} {}",
        event.event_id,
        event.event_type,
        event.partition_key,
        event.aggregate_type,
        event.aggregate_id
    );
    let _ = writeln!(
        out,
        "  created {}, {} attempts, payload version {}, {} bytes of payload{}",
        stored.created_at,
        stored.attempts,
        event.payload_version,
        event.payload.len(),
        if detail == Detail::WithPayload {
            ""
        } else {
            " (--payload prints it)"
        }
    );
    let _ = writeln!(
        out,
        "  {}{}",
        if failed.blocks_key {
            "blocks its key"
        } else {
            "does not block its key"
        },
        failed
            .superseded_by
            .map(|id| format!("; superseded by {id}"))
            .unwrap_or_default()
    );
    for (name, value) in event.headers.iter() {
        let _ = writeln!(out, "  header {name} = {value}");
    }
    let _ = writeln!(out, "history:");
    for entry in &failed.history {
        let class = entry
            .error_class
            .map(|c| format!(" ({c:?})"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {}  {:?} by {}{class}, attempts {}: {}",
            entry.at, entry.kind, entry.actor, entry.attempts, entry.detail
        );
    }
    if detail == Detail::WithPayload {
        let _ = writeln!(out, "payload:\n{}", event.payload.as_str());
    }
    out
}
