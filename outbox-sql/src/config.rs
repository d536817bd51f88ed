//! Store settings: validated table names, limits, time.

use std::sync::Arc;

use outbox_core::{Clock, EventLimits, StoreError, StoreTime, SystemClock};

/// Names of the tables a store uses, derived from one validated prefix:
/// `{prefix}_events`, `{prefix}_attempts`, `{prefix}_inbox`, `{prefix}_relays`,
/// optionally inside a schema (PostgreSQL) or database (MySQL).
///
/// Names are checked to be plain lowercase SQL identifiers, so every query
/// built from them is free of injected SQL; anything else is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableNames {
    schema: Option<String>,
    prefix: String,
}

/// The prefix of the default table names.
pub const DEFAULT_PREFIX: &str = "outbox";

impl Default for TableNames {
    fn default() -> Self {
        Self {
            schema: None,
            prefix: DEFAULT_PREFIX.to_owned(),
        }
    }
}

impl TableNames {
    /// Tables named `{prefix}_events`, … in the connection's default schema.
    pub fn with_prefix(prefix: &str) -> Result<Self, StoreError> {
        check_identifier("table prefix", prefix, 40)?;
        Ok(Self {
            schema: None,
            prefix: prefix.to_owned(),
        })
    }

    /// Places the tables in `schema` (PostgreSQL schema, MySQL database).
    /// Not supported by SQLite, which refuses it when the store is built.
    pub fn in_schema(mut self, schema: &str) -> Result<Self, StoreError> {
        check_identifier("schema", schema, 63)?;
        self.schema = Some(schema.to_owned());
        Ok(self)
    }

    /// The schema, if any.
    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `schema.` or nothing, for qualifying table names.
    pub fn qualifier(&self) -> String {
        self.schema
            .as_ref()
            .map(|s| format!("{s}."))
            .unwrap_or_default()
    }

    /// The events table, qualified.
    pub fn events(&self) -> String {
        format!("{}{}_events", self.qualifier(), self.prefix)
    }

    /// The attempt-history table, qualified.
    pub fn attempts(&self) -> String {
        format!("{}{}_attempts", self.qualifier(), self.prefix)
    }

    /// The inbox table, qualified.
    pub fn inbox(&self) -> String {
        format!("{}{}_inbox", self.qualifier(), self.prefix)
    }

    /// The relay-liveness table, qualified.
    pub fn relays(&self) -> String {
        format!("{}{}_relays", self.qualifier(), self.prefix)
    }

    /// The four tables every dialect has: events, attempts, inbox, relays.
    pub fn main_four(&self) -> [String; 4] {
        [self.events(), self.attempts(), self.inbox(), self.relays()]
    }

    /// Another table of this outbox (`<prefix>_<suffix>`), qualified.
    pub fn table(&self, suffix: &str) -> String {
        format!("{}{}_{suffix}", self.qualifier(), self.prefix)
    }

    /// Renders a schema template written with the default names
    /// (`outbox_events`, …) and `{{schema}}` before every table reference.
    pub fn render(&self, template: &str) -> String {
        template
            .replace("{{schema}}", &self.qualifier())
            .replace("outbox_", &format!("{}_", self.prefix))
    }
}

/// What a store's `migrate` found and left: the schema-version record
/// before (`None`: no outbox tables, so they were created) and after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migrated {
    /// The version the tables were at, or `None` if there were none.
    pub found: Option<i32>,
    /// The version they are at now (the store's `SCHEMA_VERSION`).
    pub version: i32,
}

impl Migrated {
    /// Whether this call created the tables.
    pub fn created(&self) -> bool {
        self.found.is_none()
    }
}

/// The tables' schema version from what is there: no events table, no
/// tables (`None`); an events table without the version record, version 1
/// (it predates the record); else the record's version (1 if empty).
pub fn installed_version(
    events_table: bool,
    version_record: bool,
    version: Option<i32>,
) -> Option<i32> {
    match (events_table, version_record) {
        (false, _) => None,
        (true, false) => Some(1),
        (true, true) => Some(version.unwrap_or(1)),
    }
}

/// Refuses tables another schema version made: an error that says which
/// and where the upgrade is described, rather than SQL failing later.
/// Tables of the expected version (or none) migrate.
pub fn check_schema_version(
    events: &str,
    found: Option<i32>,
    expected: i32,
) -> Result<Migrated, StoreError> {
    match found {
        Some(v) if v == expected => Ok(Migrated {
            found,
            version: expected,
        }),
        None => Ok(Migrated {
            found,
            version: expected,
        }),
        Some(v) => Err(StoreError::Config(format!(
            "the outbox tables ({events}) are schema version {v}; this version of the outbox \
             needs version {expected}. Drain the outbox, then follow the upgrade notes in \
             CHANGELOG.md (\"Upgrading to schema version {expected}\")"
        ))),
    }
}

/// Accepts `[a-z_][a-z0-9_]*` up to `max` bytes.
pub fn check_identifier(what: &str, value: &str, max: usize) -> Result<(), StoreError> {
    let mut chars = value.chars();
    let valid_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let valid_rest = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid_start || !valid_rest || value.len() > max {
        return Err(StoreError::Config(format!(
            "{what} {value:?} must match [a-z_][a-z0-9_]* and be at most {max} bytes"
        )));
    }
    Ok(())
}

/// Settings shared by every SQL store.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Table names.
    pub tables: TableNames,
    /// Limits checked at enqueue.
    pub limits: EventLimits,
    /// Where "now" comes from for every lease, delay, backoff, age and
    /// timestamp the store writes or compares: the database server's clock
    /// (default), so relays and producers on hosts whose clocks disagree
    /// still agree on leases. Tests shift it ([`StoreTime::Shifted`]).
    pub time: StoreTime,
    /// This process's clock. Used only to turn an event's absolute
    /// `available_at` into a delay ("in 60 s by my clock" is 60 s of store
    /// time), and to report this host's skew in [`outbox_core::store::RelayStatus`].
    pub clock: Arc<dyn Clock>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            tables: TableNames::default(),
            limits: EventLimits::default(),
            time: StoreTime::Database,
            clock: Arc::new(SystemClock),
        }
    }
}

impl StoreConfig {
    /// Default settings on the given tables.
    pub fn with_tables(tables: TableNames) -> Self {
        Self {
            tables,
            ..Self::default()
        }
    }

    /// Replaces the host clock (see [`StoreConfig::clock`]).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Replaces the store time (see [`StoreConfig::time`]).
    pub fn with_time(mut self, time: StoreTime) -> Self {
        self.time = time;
        self
    }

    /// The delay until `available_at` by the host clock, in milliseconds
    /// (`None` for "as soon as committed").
    pub fn delay_ms(&self, available_at: Option<chrono::DateTime<chrono::Utc>>) -> Option<i64> {
        available_at.map(|at| {
            let delay = outbox_core::clock::elapsed_between(at, self.clock.now());
            i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)
        })
    }

    /// How far tests have shifted store time, in microseconds (0 on the
    /// database clock).
    pub fn shift_micros(&self) -> Option<i64> {
        match &self.time {
            StoreTime::Database => None,
            StoreTime::Shifted(clock) => {
                Some(i64::try_from(clock.advanced().as_micros()).unwrap_or(i64::MAX))
            }
        }
    }

    /// Replaces the limits.
    pub fn with_limits(mut self, limits: EventLimits) -> Self {
        self.limits = limits;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_anything_but_plain_identifiers() {
        for bad in [
            "",
            "Outbox",
            "1abc",
            "a-b",
            "a;drop table x",
            "a b",
            "\"q\"",
            &"x".repeat(41),
        ] {
            let err = TableNames::with_prefix(bad).unwrap_err();
            assert!(matches!(err, StoreError::Config(_)), "{bad:?}");
            assert!(!err.is_retryable());
        }
        assert!(TableNames::default().in_schema("Bad").is_err());
        let names = TableNames::with_prefix("billing_outbox")
            .unwrap()
            .in_schema("app")
            .unwrap();
        assert_eq!(names.events(), "app.billing_outbox_events");
        assert_eq!(names.inbox(), "app.billing_outbox_inbox");
    }

    #[test]
    fn renders_templates_with_names() {
        let names = TableNames::with_prefix("t1")
            .unwrap()
            .in_schema("s")
            .unwrap();
        assert_eq!(
            names.render("CREATE INDEX outbox_events_live ON {{schema}}outbox_events (x)"),
            "CREATE INDEX t1_events_live ON s.t1_events (x)"
        );
    }
}
