//! The statements `OutboxAdmin` runs, one set per dialect, and the ones
//! dialects write alike but for how a parameter is spelled (`param`: `$1`,
//! `?1` or `?`; a dialect that spells it `?` binds the value once for each).

use outbox_core::store::FailedPage;

use crate::config::TableNames;

/// Columns that rebuild a [`outbox_core::RawEvent`], in the row mapper's order.
pub const EVENT_COLUMNS: &str = "sequence, event_id, aggregate_type, aggregate_id, \
    event_type, partition_key, payload, payload_version, headers, created_at, available_at, attempts";

/// Each field is the statement of the `OutboxAdmin` call it is named
/// after (`admin_traits.rs` runs them); its parameters and result columns
/// are what that call binds and maps.
#[allow(missing_docs)]
pub struct AdminQueries {
    pub stats: String,
    pub held_back: String,
    pub event_state: String,
    pub failed_events: FailedQueries,
    pub failed_event: String,
    pub history: String,
    pub blocked_keys: String,
    pub requeue: String,
    pub skip: String,
    pub relays: String,
    pub last_sequence: String,
}

impl AdminQueries {
    /// The statements of a store whose rows hold their state (MySQL,
    /// SQLite): `param` spells its first parameter (and, as `?`, every
    /// one), `spell` its `n`-th, `earlier` says that row `e2` of a key comes before row `b` in
    /// claim order; `requeue` and `skip` are the dialect's own.
    pub fn over_rows(
        names: &TableNames,
        param: &str,
        spell: fn(usize) -> String,
        earlier: &str,
        requeue: String,
        skip: String,
    ) -> Self {
        let events = names.events();
        Self {
            stats: row_stats(names, param),
            held_back: row_held_back(names, param),
            event_state: row_event_state(names, param),
            failed_events: FailedQueries::new(names, EVENT_COLUMNS, spell),
            failed_event: failed_event(names, EVENT_COLUMNS, param),
            history: history(names, param),
            blocked_keys: format!(
                "SELECT b.partition_key, b.event_id,
                     (SELECT COUNT(*) FROM {events} p
                      WHERE p.partition_key = b.partition_key AND p.status = 0)
                     + (SELECT COUNT(*) FROM {events} p
                        WHERE p.partition_key = b.partition_key AND p.status = 4) AS backlog
                 FROM {events} b
                 WHERE b.status = 3 AND b.blocks_key AND NOT EXISTS (
                     SELECT 1 FROM {events} e2
                     WHERE e2.partition_key = b.partition_key AND e2.status = 3 AND e2.blocks_key
                       AND {earlier})
                 ORDER BY b.partition_key"
            ),
            requeue,
            skip,
            relays: relays(names),
            last_sequence: last_sequence(names),
        }
    }
}

/// A page of failed events in sequence order (`columns`: the dialect's
/// event columns), with what an operator may do to them: one statement for
/// each of the filters a page may set, so each reads its own index (failed
/// rows of a type, of a key) and a rare type or key is found without
/// stepping over the failed rows of the others.
pub struct FailedQueries {
    /// Pages, by [`FailedQueries::variant`].
    pages: [String; 4],
    /// Counts of those not superseded, and the newest one's sequence.
    counts: [String; 4],
}

impl FailedQueries {
    /// The statements, their `n`-th parameter spelled by `spell` (`$n`,
    /// `?n` or `?`): after (sequence), then the type and the key where the
    /// statement filters by them, then (pages only) the limit.
    pub fn new(names: &TableNames, columns: &str, spell: fn(usize) -> String) -> Self {
        let events = names.events();
        let filters: [&[&str]; 4] = [
            &[],
            &["event_type"],
            &["partition_key"],
            &["event_type", "partition_key"],
        ];
        let statement = |select: &str, filters: &[&str], more: &str| {
            let mut sql = format!(
                "SELECT {select} FROM {events} WHERE status = 3{more} AND sequence > {}",
                spell(1)
            );
            for (i, column) in filters.iter().enumerate() {
                sql.push_str(&format!(" AND {column} = {}", spell(i + 2)));
            }
            sql
        };
        Self {
            pages: filters.map(|f| {
                let select = format!("{columns}, blocks_key, superseded_by");
                let limit = spell(f.len() + 2);
                statement(&select, f, "") + &format!(" ORDER BY sequence LIMIT {limit}")
            }),
            counts: filters.map(|f| {
                let select = "COUNT(*) AS failed, MAX(sequence) AS last_sequence";
                statement(select, f, " AND superseded_by IS NULL")
            }),
        }
    }

    /// The statement that reads `page`, and its parameters in order.
    pub fn for_page<P: From<i64> + From<String>>(&self, page: &FailedPage) -> (&str, Vec<P>) {
        let mut params = Self::filter_params(page);
        params.push(P::from(page.limit.min(i64::MAX as usize) as i64));
        (&self.pages[Self::variant(page)], params)
    }

    /// The statement that counts what `page`'s filters match (columns
    /// `failed`, `last_sequence`), and its parameters in order.
    pub fn for_count<P: From<i64> + From<String>>(&self, page: &FailedPage) -> (&str, Vec<P>) {
        (&self.counts[Self::variant(page)], Self::filter_params(page))
    }

    fn variant(page: &FailedPage) -> usize {
        usize::from(page.event_type.is_some()) + 2 * usize::from(page.partition_key.is_some())
    }

    fn filter_params<P: From<i64> + From<String>>(page: &FailedPage) -> Vec<P> {
        let mut params = vec![P::from(page.after_sequence.unwrap_or(i64::MIN))];
        params.extend(page.event_type.clone().map(P::from));
        params.extend(page.partition_key.clone().map(P::from));
        params
    }
}

/// One failed event by id (`param`), in `columns` as [`FailedQueries`].
pub fn failed_event(names: &TableNames, columns: &str, param: &str) -> String {
    let events = names.events();
    format!(
        "SELECT {columns}, blocks_key, superseded_by FROM {events}
         WHERE event_id = {param} AND status = 3"
    )
}

/// An event's attempt history in the order written (`param`: its id).
pub fn history(names: &TableNames, param: &str) -> String {
    let attempts = names.attempts();
    format!(
        "SELECT event_id, kind, at, actor, error_class, detail, attempts
         FROM {attempts} WHERE event_id = {param} ORDER BY id"
    )
}

/// The newest event's sequence (the primary key's last entry), `NULL`
/// when the table is empty.
pub fn last_sequence(names: &TableNames) -> String {
    format!(
        "SELECT MAX(sequence) AS last_sequence FROM {}",
        names.events()
    )
}

/// Every relay's last heartbeat.
pub fn relays(names: &TableNames) -> String {
    let relays = names.relays();
    format!(
        "SELECT relay, last_seen, clock_skew_ms, outage_since, outage_destination,
             outage_reason
         FROM {relays} ORDER BY relay"
    )
}

/// An event's row state (`param`: its id), for the stores whose rows hold
/// their lease (MySQL, SQLite).
fn row_event_state(names: &TableNames, param: &str) -> String {
    let events = names.events();
    format!(
        "SELECT status, available_at, attempts, lease_owner, lease_expires_at, published_at,
                blocks_key, superseded_by
         FROM {events} WHERE event_id = {param}"
    )
}

/// Per event type, counted over the rows (MySQL, SQLite; `now`: store time).
/// Rows set aside behind a row of their key not yet due (status 5) are
/// claimable, as the rows behind a key's row in flight are: they wait for
/// their key, not for an operator.
fn row_stats(names: &TableNames, now: &str) -> String {
    let events = names.events();
    let claimable = format!(
        "(e.status = 5 OR (e.status = 0 AND b.partition_key IS NULL AND e.available_at <= {now}))"
    );
    format!(
        "SELECT e.event_type,
             CAST(SUM({claimable}) AS SIGNED) AS claimable,
             MIN(CASE WHEN {claimable} THEN e.available_at END) AS oldest,
             CAST(SUM(e.status = 0 AND b.partition_key IS NULL AND e.available_at > {now})
                 AS SIGNED) AS parked,
             CAST(SUM(e.status = 4 OR (e.status = 0 AND b.partition_key IS NOT NULL))
                 AS SIGNED) AS blocked,
             CAST(SUM(e.status = 1) AS SIGNED) AS in_flight,
             CAST(SUM(e.status = 3) AS SIGNED) AS failed
         FROM {events} e
         LEFT JOIN (SELECT DISTINCT partition_key FROM {events}
                    WHERE status = 3 AND blocks_key) b
             ON b.partition_key = e.partition_key AND e.status = 0
         WHERE e.status IN (0, 1, 3, 4, 5)
         GROUP BY e.event_type ORDER BY e.event_type"
    )
}

/// What holds publication back, counted over the rows (MySQL, SQLite;
/// `now`: store time).
fn row_held_back(names: &TableNames, now: &str) -> String {
    let events = names.events();
    format!(
        "SELECT
             (SELECT COUNT(DISTINCT partition_key) FROM {events}
              WHERE status = 3 AND blocks_key) AS blocked_keys,
             (SELECT COUNT(*) FROM {events} p
              WHERE p.status = 0 AND p.partition_key IN (
                  SELECT partition_key FROM {events} WHERE status = 3 AND blocks_key))
             + (SELECT COUNT(*) FROM {events} WHERE status = 4) AS blocked_waiting,
             (SELECT COUNT(DISTINCT partition_key) FROM {events}
              WHERE status = 0 AND available_at > {now}) AS backoff_keys,
             (SELECT COUNT(*) FROM {events} p
              WHERE p.status = 0 AND p.partition_key IN (
                  SELECT partition_key FROM {events} WHERE status = 0 AND available_at > {now}))
             + (SELECT COUNT(*) FROM {events} WHERE status = 5) AS backoff_waiting,
             (SELECT MIN(available_at) FROM {events}
              WHERE status = 0 AND available_at > {now}) AS next_due,
             (SELECT COUNT(DISTINCT lease_id) FROM {events}
              WHERE status = 1 AND lease_expires_at <= {now}) AS expired_leases,
             (SELECT COUNT(*) FROM {events}
              WHERE status = 1 AND lease_expires_at <= {now}) AS expired_events,
             (SELECT MIN(lease_expires_at) FROM {events}
              WHERE status = 1 AND lease_expires_at <= {now}) AS first_expired_at,
             (SELECT COUNT(*) FROM {events} WHERE status = 0 AND suspect) AS suspects"
    )
}
