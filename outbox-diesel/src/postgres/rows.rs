//! The rows `outbox-sql`'s PostgreSQL statements return, as Diesel maps
//! them (column names and SQL types as the statements spell them).

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{
    Array, BigInt, Bool, Integer, Nullable, SmallInt, Text, Timestamptz, Uuid as SqlUuid,
};
use outbox_core::store::AttemptRecord;
use outbox_core::{EventId, RawEvent, StoreError};

/// `EVENT_COLUMNS`: an event not yet trusted (decoding is per row).
#[derive(QueryableByName)]
pub(super) struct EventRow {
    #[diesel(sql_type = BigInt)]
    sequence: i64,
    #[diesel(sql_type = SqlUuid)]
    event_id: uuid::Uuid,
    #[diesel(sql_type = Text)]
    aggregate_type: String,
    #[diesel(sql_type = Text)]
    aggregate_id: String,
    #[diesel(sql_type = Text)]
    event_type: String,
    #[diesel(sql_type = Text)]
    partition_key: String,
    #[diesel(sql_type = Text)]
    payload: String,
    #[diesel(sql_type = Integer)]
    payload_version: i32,
    #[diesel(sql_type = Text)]
    headers: String,
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    available_at: DateTime<Utc>,
    #[diesel(sql_type = Integer)]
    attempts: i32,
}

impl EventRow {
    pub(super) fn event_id(&self) -> uuid::Uuid {
        self.event_id
    }

    pub(super) fn raw(self) -> RawEvent {
        RawEvent {
            sequence: self.sequence,
            event_id: EventId::from_uuid(self.event_id),
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            event_type: self.event_type,
            partition_key: self.partition_key,
            payload: self.payload,
            payload_version: i64::from(self.payload_version),
            headers: self.headers,
            created_at: self.created_at,
            available_at: self.available_at,
            attempts: i64::from(self.attempts),
        }
    }
}

/// A row of the claim function.
#[derive(QueryableByName)]
pub(super) struct ClaimedRow {
    #[diesel(embed)]
    pub(super) event: EventRow,
    #[diesel(sql_type = Bool)]
    pub(super) crash_looped: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(super) fencing_token: Option<i64>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub(super) lease_expires_at: Option<DateTime<Utc>>,
}

/// A settlement's returned row.
#[derive(QueryableByName)]
pub(super) struct Settled {
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(super) sequence: Option<i64>,
}

/// `stats`.
#[derive(QueryableByName)]
pub(super) struct StatsRow {
    #[diesel(sql_type = Text)]
    pub(super) event_type: String,
    #[diesel(sql_type = BigInt)]
    pub(super) claimable: i64,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub(super) oldest: Option<DateTime<Utc>>,
    #[diesel(sql_type = BigInt)]
    pub(super) parked: i64,
    #[diesel(sql_type = BigInt)]
    pub(super) in_flight: i64,
    #[diesel(sql_type = BigInt)]
    pub(super) failed: i64,
    #[diesel(sql_type = Timestamptz)]
    pub(super) now: DateTime<Utc>,
    #[diesel(sql_type = BigInt)]
    pub(super) blocked: i64,
}

/// `held_back`.
#[derive(QueryableByName)]
pub(super) struct HeldBackRow {
    #[diesel(sql_type = BigInt)]
    pub(super) blocked_keys: i64,
    #[diesel(sql_type = BigInt)]
    pub(super) blocked_waiting: i64,
    #[diesel(sql_type = BigInt)]
    pub(super) backoff_keys: i64,
    #[diesel(sql_type = BigInt)]
    pub(super) backoff_waiting: i64,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub(super) next_due: Option<DateTime<Utc>>,
    #[diesel(sql_type = BigInt)]
    pub(super) expired_leases: i64,
    #[diesel(sql_type = BigInt)]
    pub(super) expired_events: i64,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub(super) first_expired_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Array<Text>>)]
    pub(super) long_owners: Option<Vec<String>>,
    #[diesel(sql_type = BigInt)]
    pub(super) long_events: i64,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub(super) long_claimed_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub(super) long_expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = BigInt)]
    pub(super) suspects: i64,
}

/// `open_transactions`.
#[derive(QueryableByName)]
pub(super) struct OpenTransactionRow {
    #[diesel(sql_type = BigInt)]
    pub(super) pid: i64,
    #[diesel(sql_type = Text)]
    pub(super) database: String,
    #[diesel(sql_type = Timestamptz)]
    pub(super) xact_start: DateTime<Utc>,
    #[diesel(sql_type = Text)]
    pub(super) state: String,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub(super) query_start: Option<DateTime<Utc>>,
}

/// `event_state`.
#[derive(QueryableByName)]
pub(super) struct EventStateRow {
    #[diesel(sql_type = SmallInt)]
    pub(super) status: i16,
    #[diesel(sql_type = Timestamptz)]
    pub(super) available_at: DateTime<Utc>,
    #[diesel(sql_type = Integer)]
    pub(super) attempts: i32,
    #[diesel(sql_type = Nullable<Text>)]
    pub(super) lease_owner: Option<String>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub(super) lease_expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub(super) published_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Bool)]
    pub(super) blocks_key: bool,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub(super) superseded_by: Option<uuid::Uuid>,
}

/// `failed_events`.
#[derive(QueryableByName)]
pub(super) struct FailedRow {
    #[diesel(embed)]
    pub(super) event: EventRow,
    #[diesel(sql_type = Bool)]
    pub(super) blocks_key: bool,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub(super) superseded_by: Option<uuid::Uuid>,
}

/// `history` / `history_many`.
#[derive(QueryableByName)]
pub(super) struct HistoryRow {
    #[diesel(sql_type = SqlUuid)]
    pub(super) event_id: uuid::Uuid,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Timestamptz)]
    at: DateTime<Utc>,
    #[diesel(sql_type = Text)]
    actor: String,
    #[diesel(sql_type = Nullable<Text>)]
    error_class: Option<String>,
    #[diesel(sql_type = Text)]
    detail: String,
    #[diesel(sql_type = Integer)]
    attempts: i32,
}

impl HistoryRow {
    pub(super) fn record(self) -> Result<AttemptRecord, StoreError> {
        Ok(AttemptRecord {
            kind: outbox_sql::codes::attempt_kind(&self.kind)?,
            at: self.at,
            actor: self.actor,
            error_class: self
                .error_class
                .as_deref()
                .map(outbox_sql::codes::error_class)
                .transpose()?,
            detail: self.detail,
            attempts: self.attempts as u32,
        })
    }
}

/// `blocked_keys`.
#[derive(QueryableByName)]
pub(super) struct BlockedKeyRow {
    #[diesel(sql_type = Text)]
    pub(super) partition_key: String,
    #[diesel(sql_type = SqlUuid)]
    pub(super) event_id: uuid::Uuid,
    #[diesel(sql_type = BigInt)]
    pub(super) backlog: i64,
}

/// `requeue` / `skip` / `supersede_lock`.
#[derive(QueryableByName)]
pub(super) struct OperatorRow {
    #[diesel(sql_type = Integer)]
    pub(super) attempts: i32,
    #[diesel(sql_type = Text)]
    pub(super) partition_key: String,
}

/// `supersede_lock`'s position.
#[derive(QueryableByName)]
pub(super) struct PositionRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(super) position: Option<i64>,
    #[diesel(embed)]
    pub(super) row: OperatorRow,
}

/// `supersede_insert`.
#[derive(QueryableByName)]
pub(super) struct SequenceRow {
    #[diesel(sql_type = BigInt)]
    pub(super) sequence: i64,
}

/// `purge`.
#[derive(QueryableByName)]
pub(super) struct CountRow {
    #[diesel(sql_type = BigInt)]
    pub(super) count: i64,
}

/// `relays`.
#[derive(QueryableByName)]
pub(super) struct RelayRow {
    #[diesel(sql_type = Text)]
    pub(super) relay: String,
    #[diesel(sql_type = Timestamptz)]
    pub(super) last_seen: DateTime<Utc>,
    #[diesel(sql_type = BigInt)]
    pub(super) clock_skew_ms: i64,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub(super) outage_since: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(super) outage_destination: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(super) outage_reason: Option<String>,
}
