//! Where the services are and how a scenario gets a clean outbox on each.
//!
//! Everything lives in databases of the bench's own (`outbox_bench`), so a
//! run never touches what the tests use. Each round starts from empty tables.

use std::time::Duration;

use outbox_core::store::{ClaimRequest, ClaimedEvent, Nack, NackAction, OutboxStore, RelayId};
use outbox_core::{ErrorClass, NewEvent, Ordering, PoisonPolicy, StoreError};
use outbox_sqlx::mysql::MySqlStore;
use outbox_sqlx::postgres::PgStore;
use outbox_sqlx::sqlite::SqliteStore;
use outbox_sqlx::{StoreConfig, TableNames, guard_cancelled_transactions};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool};

/// A boxed error: the harness reports and exits on any failure.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The bench's database name on every server.
pub const DATABASE: &str = "outbox_bench";

fn var(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

/// PostgreSQL server URL without a database (`OUTBOX_BENCH_PG`).
pub fn pg_server() -> String {
    var("OUTBOX_BENCH_PG", "postgres://postgres@127.0.0.1:5432")
}

/// MariaDB/MySQL server URL (`OUTBOX_BENCH_MYSQL`).
pub fn mysql_server() -> String {
    var("OUTBOX_BENCH_MYSQL", "mysql://root@127.0.0.1:3306")
}

/// Redis URL (`OUTBOX_BENCH_REDIS`).
pub fn redis_url() -> String {
    var("OUTBOX_BENCH_REDIS", "redis://127.0.0.1:6379")
}

/// Kafka bootstrap servers (`OUTBOX_KAFKA_BOOTSTRAP`, as the tests).
pub fn kafka_bootstrap() -> String {
    var("OUTBOX_KAFKA_BOOTSTRAP", "127.0.0.1:19092")
}

/// The SNS/SQS emulator (`OUTBOX_SNS_ENDPOINT`, as the tests).
pub fn sns_endpoint() -> String {
    var("OUTBOX_SNS_ENDPOINT", "http://127.0.0.1:4566")
}

/// An AWS SDK config for the emulator: static test credentials, one region,
/// the SDK's default retries.
pub fn sns_config() -> aws_types::SdkConfig {
    use aws_credential_types::Credentials;
    use aws_credential_types::provider::SharedCredentialsProvider;
    aws_types::SdkConfig::builder()
        .endpoint_url(sns_endpoint())
        .region(aws_types::region::Region::new("us-east-1"))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "bench",
            "bench",
            None,
            None,
            "outbox-bench",
        )))
        .behavior_version(aws_sdk_sns::config::BehaviorVersion::latest())
        .build()
}

/// The `outbox` binary built beside the bench (the dashboard and the
/// tenants daemon rows run it).
pub fn outbox_binary() -> Result<std::path::PathBuf, Error> {
    let binary = std::env::current_exe()?.with_file_name("outbox");
    if !binary.exists() {
        return Err(format!(
            "{} is missing: build it beside the bench (cargo build --release -p outbox-cli)",
            binary.display()
        )
        .into());
    }
    Ok(binary)
}

/// A pool on the bench database, created if missing.
pub async fn pg_pool(max_connections: u32) -> Result<PgPool, Error> {
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&format!("{}/postgres", pg_server()))
        .await?;
    // Recreated once per run: tables of an older schema never linger.
    static FRESH: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    FRESH
        .get_or_try_init(|| async {
            admin
                .execute(&*format!("DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
                .await?;
            admin
                .execute(&*format!("CREATE DATABASE {DATABASE}"))
                .await
                .map(drop)
        })
        .await?;
    admin.close().await;
    pg_bench_pool(max_connections).await
}

/// A pool on the bench database as it is (a relay process of the fleet
/// must not recreate it under its parent).
pub async fn pg_bench_pool(max_connections: u32) -> Result<PgPool, Error> {
    Ok(guard_cancelled_transactions(PgPoolOptions::new())
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&format!("{}/{DATABASE}", pg_server()))
        .await?)
}

/// The Diesel store (diesel-async, deadpool) on the bench database's tables
/// (migrated by [`pg_store`] first).
pub fn diesel_pg_store() -> Result<outbox_diesel::postgres::PgStore, Error> {
    use outbox_diesel::diesel_async::AsyncPgConnection;
    use outbox_diesel::diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use outbox_diesel::diesel_async::pooled_connection::deadpool::Pool;
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(format!(
        "{}/{DATABASE}",
        pg_server()
    ));
    let pool = Pool::builder(manager).max_size(8).build()?;
    Ok(outbox_diesel::postgres::PgStore::new(pool, config()?))
}

/// The outbox on PostgreSQL with the bench's table prefix, migrated.
pub async fn pg_store(pool: &PgPool) -> Result<PgStore, Error> {
    let store = PgStore::new(pool.clone(), config()?);
    store.migrate().await?;
    Ok(store)
}

/// The outbox on PostgreSQL with the bench's table prefix, as another
/// process migrated it.
pub fn pg_store_unmigrated(pool: &PgPool) -> Result<PgStore, Error> {
    Ok(PgStore::new(pool.clone(), config()?))
}

/// Empties the bench's outbox tables on PostgreSQL and rewinds the cursor
/// (a relay stopped while waiting for NOTIFY leaves `relay_waiting` set;
/// producers would notify until the next claim).
pub async fn pg_reset(pool: &PgPool) -> Result<(), Error> {
    pg_reset_tables(pool, "bench").await
}

/// Empties the outbox tables named with `prefix` (as [`pg_reset`]).
pub async fn pg_reset_tables(pool: &PgPool, prefix: &str) -> Result<(), Error> {
    let p = prefix;
    pool.execute(&*format!(
        "TRUNCATE {p}_events, {p}_attempts, {p}_inbox, {p}_relays, {p}_leases, {p}_cursor_log,
             {p}_order, {p}_cursor_states, {p}_lanes;
         ALTER SEQUENCE {p}_events_seq RESTART;
         ALTER SEQUENCE {p}_pass_window RESTART;
         SELECT setval('{p}_relay_waiting', 0)"
    ))
    .await?;
    Ok(())
}

/// Another application's write transaction, open in another database
/// (`postgres`) until [`StrangerTransaction::end`]: it holds the server's
/// xmin back the whole time, as a long report or import would.
pub struct StrangerTransaction {
    pool: PgPool,
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
}

impl StrangerTransaction {
    /// Opens it, with a transaction id of its own.
    pub async fn open() -> Result<Self, Error> {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&format!("{}/postgres", pg_server()))
            .await?;
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT pg_current_xact_id()")
            .execute(&mut *tx)
            .await?;
        Ok(Self { pool, tx })
    }

    /// Rolls it back and closes its connection.
    pub async fn end(self) -> Result<(), Error> {
        self.tx.rollback().await?;
        self.pool.close().await;
        Ok(())
    }
}

/// The outbox on MariaDB in database `outbox_bench`, migrated and empty.
pub async fn mysql_store(max_connections: u32) -> Result<MySqlStore, Error> {
    let admin = MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&mysql_server())
        .await?;
    admin
        .execute(&*format!("CREATE DATABASE IF NOT EXISTS {DATABASE}"))
        .await?;
    // Recreated once per run: tables of an older schema never linger.
    static FRESH: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    FRESH
        .get_or_try_init(|| async {
            admin
                .execute(&*format!("DROP DATABASE IF EXISTS {DATABASE}"))
                .await?;
            admin
                .execute(&*format!("CREATE DATABASE {DATABASE}"))
                .await
                .map(drop)
        })
        .await?;
    admin.close().await;
    let pool = guard_cancelled_transactions(MySqlPoolOptions::new())
        .max_connections(max_connections)
        .connect(&format!("{}/{DATABASE}", mysql_server()))
        .await?;
    let store = MySqlStore::new(pool, config()?);
    store.migrate().await?;
    Ok(store)
}

/// Empties the MariaDB bench outbox for the next contender. `TRUNCATE`
/// rather than `DELETE`: a `DELETE` leaves every row's index entries for
/// InnoDB's purge, and while purge works through that backlog the next
/// drain's own delete-marked entries pile up too; per-key claims, which
/// probe a key's in-flight range once per candidate, then slowed
/// quadratically (a one-key drain at 257 events/s after the drain-sql
/// scenario, 7,898 unordered). Every contender starts from a fresh table,
/// as on PostgreSQL.
pub async fn mysql_reset(store: &MySqlStore) -> Result<(), Error> {
    for table in ["bench_events", "bench_attempts"] {
        store
            .pool()
            .execute(&*format!("TRUNCATE TABLE {table}"))
            .await?;
    }
    Ok(())
}

/// The Diesel store (diesel-async, deadpool) on the MariaDB bench
/// database's tables (made by [`mysql_store`] first).
pub fn diesel_mysql_store(
    max_connections: usize,
) -> Result<outbox_diesel::mysql::MysqlStore, Error> {
    use outbox_diesel::diesel_async::AsyncMysqlConnection;
    use outbox_diesel::diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use outbox_diesel::diesel_async::pooled_connection::deadpool::Pool;
    let manager = AsyncDieselConnectionManager::<AsyncMysqlConnection>::new(format!(
        "{}/{DATABASE}",
        mysql_server()
    ));
    let pool = Pool::builder(manager).max_size(max_connections).build()?;
    Ok(outbox_diesel::mysql::MysqlStore::new(pool, config()?))
}

/// The outbox on a fresh SQLite file under `dir`.
pub async fn sqlite_store(dir: &std::path::Path) -> Result<SqliteStore, Error> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // A file of its own per call: a closed pool's connection threads may
    // still be closing their handles, and the last close of a database
    // deletes its `-wal` by path, so reusing the path would delete the new
    // store's log under it (SQLite "disk I/O error", short read). Files of
    // two calls ago are long closed and removed.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    std::fs::create_dir_all(dir)?;
    let file = |n: usize| dir.join(format!("bench-{}-{n}.sqlite", std::process::id()));
    if call == 0 {
        for entry in std::fs::read_dir(dir)? {
            let _ = std::fs::remove_file(entry?.path());
        }
    }
    if let Some(old) = call.checked_sub(2) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", file(old).display()));
        }
    }
    let path = file(call);
    let store = SqliteStore::open(&path.display().to_string(), config()?).await?;
    store.migrate().await?;
    Ok(store)
}

fn config() -> Result<StoreConfig, StoreError> {
    Ok(StoreConfig::with_tables(TableNames::with_prefix("bench")?))
}

/// Distinct ordering keys in generated backlogs (subscriptions).
pub const KEYS: usize = 10_000;

/// The `i`-th event of a generated backlog: an invoice paid, about 120
/// bytes of JSON, keyed by one of [`KEYS`] subscriptions.
pub fn event(round: usize, i: usize) -> NewEvent {
    event_for_key(round, i, i % KEYS)
}

/// Like [`event`], for subscription `key`.
pub fn event_for_key(round: usize, i: usize, key: usize) -> NewEvent {
    NewEvent::builder("invoice.paid", "invoice", format!("inv-{round}-{i}"))
        .event_id(outbox_core::EventId::random())
        .partition_key(format!("sub-{key}"))
        .payload(&serde_json::json!({
            "invoice_id": format!("inv-{round}-{i}"),
            "subscription_id": format!("sub-{key}"),
            "amount_cents": 1000 + (i % 9000),
            "currency": "EUR",
        }))
        .build()
        .expect("generated events are valid")
}

/// An event of aggregate `invoice` on the named partition key (a hot key's,
/// say), numbered `n`.
pub fn event_on_key(key: &str, invoice: &str, n: usize) -> NewEvent {
    NewEvent::builder("invoice.paid", "invoice", invoice)
        .event_id(outbox_core::EventId::random())
        .partition_key(key)
        .payload(&serde_json::json!({ "invoice_id": invoice, "amount_cents": n }))
        .build()
        .expect("generated events are valid")
}

/// Events per enqueue transaction when filling a backlog.
pub const FILL_CHUNK: usize = 5_000;

/// Fills the PostgreSQL outbox with `n` pending events through the real
/// enqueue path, then refreshes the planner's statistics.
pub async fn pg_fill(store: &PgStore, round: usize, n: usize) -> Result<(), Error> {
    pg_fill_with(store, n, |i| event(round, i)).await
}

/// Like [`pg_fill`], with the `i`-th event from `event`.
pub async fn pg_fill_with(
    store: &PgStore,
    n: usize,
    event: impl Fn(usize) -> NewEvent,
) -> Result<(), Error> {
    pg_fill_in(store, n, FILL_CHUNK, event).await
}

/// Like [`pg_fill_with`], `per_transaction` events a transaction.
pub async fn pg_fill_in(
    store: &PgStore,
    n: usize,
    per_transaction: usize,
    event: impl Fn(usize) -> NewEvent,
) -> Result<(), Error> {
    for start in (0..n).step_by(per_transaction) {
        let end = (start + per_transaction).min(n);
        let events: Vec<NewEvent> = (start..end).map(&event).collect();
        let mut tx = store.pool().begin().await?;
        store.enqueue(&mut tx, &events).await?;
        tx.commit().await?;
    }
    store.pool().execute("ANALYZE bench_events").await?;
    Ok(())
}

/// Enqueues `n` events through any store's own transactions, in chunks of
/// [`FILL_CHUNK`], the `i`-th from `event`; the planner's statistics are
/// left as they were.
pub async fn fill_writer(
    store: &dyn outbox_core::OutboxWriter,
    n: usize,
    event: impl Fn(usize) -> NewEvent,
) -> Result<(), Error> {
    for start in (0..n).step_by(FILL_CHUNK) {
        let events: Vec<NewEvent> = (start..(start + FILL_CHUNK).min(n)).map(&event).collect();
        store.enqueue(&events).await?;
    }
    Ok(())
}

/// Fails unless the store reports nothing claimable, parked, in flight or
/// failed: every one of the `expected` events was settled as published.
pub async fn check_drained(
    store: &dyn outbox_core::OutboxAdmin,
    expected: usize,
) -> Result<(), Error> {
    check_left_open(store, expected, 0).await
}

/// Like [`check_drained`], where exactly `left_open` events (a troubled
/// key's) must still be open.
pub async fn check_left_open(
    store: &dyn outbox_core::OutboxAdmin,
    expected: usize,
    left_open: usize,
) -> Result<(), Error> {
    let stats = store.stats().await?;
    let open: u64 = stats
        .iter()
        .map(|s| s.claimable + s.blocked + s.parked + s.in_flight + s.failed)
        .sum();
    if open != left_open as u64 {
        return Err(format!(
            "{open} events open after draining {expected} (expected {left_open}): {stats:?}"
        )
        .into());
    }
    Ok(())
}

/// The server's current WAL position, to count what a run wrote.
pub async fn pg_wal_position(pool: &PgPool) -> Result<String, Error> {
    Ok(sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await?)
}

/// WAL bytes written since `position` (whole server: runs are alone on it).
pub async fn pg_wal_bytes_since(pool: &PgPool, position: &str) -> Result<f64, Error> {
    let bytes: f64 = sqlx::query_scalar(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::float8",
    )
    .bind(position)
    .fetch_one(pool)
    .await?;
    Ok(bytes)
}

/// Claims the heads of `keys` keys with pending events for a relay that
/// never settles them itself (leased for ten minutes, per key, up to 1,000
/// a claim): how a bench sets keys up to fail, block or back off.
pub async fn claim_heads<S>(store: &S, keys: usize) -> Result<Vec<ClaimedEvent>, Error>
where
    S: OutboxStore + ?Sized,
{
    let mut heads = Vec::with_capacity(keys);
    while heads.len() < keys {
        let claimed = store
            .claim_batch(&ClaimRequest {
                owner: RelayId::new("bench-troubled"),
                limit: 1_000.min(keys - heads.len()),
                lease_duration: Duration::from_secs(600),
                ordering: Ordering::PerKey,
                poison: PoisonPolicy::Block,
                crash_loop_limit: 5,
            })
            .await?;
        if claimed.events.is_empty() {
            return Err(format!("claimed {} of {keys} heads", heads.len()).into());
        }
        heads.extend(claimed.events);
    }
    Ok(heads)
}

/// One per-key claim over keys that only wait (nothing to lease), as a
/// relay's claims meet them within a poll of their failure: MySQL and
/// SQLite set their rows aside there, once. Returns how long it took.
pub async fn meet_waiting<S>(store: &S) -> Result<Duration, Error>
where
    S: OutboxStore + ?Sized,
{
    let started = std::time::Instant::now();
    let claimed = store
        .claim_batch(&ClaimRequest {
            owner: RelayId::new("bench-meets-waiting"),
            limit: 1_000,
            lease_duration: Duration::from_secs(600),
            ordering: Ordering::PerKey,
            poison: PoisonPolicy::Block,
            crash_loop_limit: 5,
        })
        .await?;
    if !claimed.events.is_empty() {
        return Err(format!("{} events leased among waiting keys", claimed.events.len()).into());
    }
    Ok(started.elapsed())
}

/// Nacks every one of `claimed` with `action`, the publish having failed
/// with `error`, 1,000 a call.
pub async fn nack_all<S>(
    store: &S,
    claimed: &[ClaimedEvent],
    action: NackAction,
    error: (ErrorClass, &str),
) -> Result<(), Error>
where
    S: OutboxStore + ?Sized,
{
    for chunk in claimed.chunks(1_000) {
        let nacks: Vec<Nack> = chunk
            .iter()
            .map(|head| Nack {
                lease: head.lease.clone(),
                action: action.clone(),
                error_class: error.0,
                error: error.1.into(),
            })
            .collect();
        store.nack(&nacks).await?;
    }
    Ok(())
}

/// Fails every one of `claimed`, blocking its key (`PoisonPolicy::Block`).
pub async fn block_all<S>(store: &S, claimed: &[ClaimedEvent]) -> Result<(), Error>
where
    S: OutboxStore + ?Sized,
{
    let fail = NackAction::Fail {
        reason: outbox_core::store::FailReason::Permanent,
        block_key: true,
    };
    let error = (
        ErrorClass::Permanent,
        "bench: the key's head cannot be published",
    );
    nack_all(store, claimed, fail, error).await
}

/// Retries every one of `claimed` an hour later (its key backs off).
pub async fn back_off_all<S>(store: &S, claimed: &[ClaimedEvent]) -> Result<(), Error>
where
    S: OutboxStore + ?Sized,
{
    let retry = NackAction::Retry {
        after: Duration::from_secs(3_600),
    };
    let error = (ErrorClass::Transient, "bench: the broker is away");
    nack_all(store, claimed, retry, error).await
}
