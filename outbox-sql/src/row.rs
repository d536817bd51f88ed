//! A result row as every dialect's driver hands it to its protocol: values
//! by column name, read as the protocol needs them.
//!
//! Drivers decode each column by its type into a [`Value`](crate::row::Value); the readers
//! accept each way a dialect stores a thing (MySQL keeps booleans as
//! TINYINT, times as microseconds, event ids as text and sums as DECIMAL
//! text; PostgreSQL has `boolean`, `timestamptz` and `uuid`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use chrono::{DateTime, Utc};
use outbox_core::event::RawEvent;
use outbox_core::{EventId, StoreError};
use uuid::Uuid;

/// A value as a row carries it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// Any integer type.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// Text, valid UTF-8.
    Text(String),
    /// Bytes that are not UTF-8.
    Bytes(Vec<u8>),
    /// A `uuid`.
    Uuid(Uuid),
    /// A `timestamptz`.
    Time(DateTime<Utc>),
    /// A text array.
    Texts(Vec<String>),
}

impl Value {
    /// Text or binary as the server sent it (MySQL's binary-collated text
    /// arrives flagged binary): UTF-8 is kept as text, checked once here.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        match String::from_utf8(bytes) {
            Ok(text) => Self::Text(text),
            Err(e) => Self::Bytes(e.into_bytes()),
        }
    }
}

/// Times stored as microseconds since the Unix epoch (MySQL, SQLite):
/// integers compare and index exactly, unlike text timestamps of varying
/// precision.
pub fn from_micros(micros: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| StoreError::fatal(format!("stored time {micros} out of range")))
}

/// One result row: values by column name.
#[derive(Debug)]
pub struct Row {
    names: Arc<[String]>,
    values: Vec<Value>,
    /// Where the next lookup starts: readers take columns mostly in the
    /// statement's order, so each name is found at the first comparison.
    next: AtomicUsize,
}

impl Clone for Row {
    fn clone(&self) -> Self {
        Self::new(self.names.clone(), self.values.clone())
    }
}

fn wrong_type(column: &str, expected: &str, found: &Value) -> StoreError {
    let found = match found {
        Value::Bytes(_) => "bytes that are not UTF-8".to_owned(),
        other => format!("{other:?}"),
    };
    StoreError::fatal(format!(
        "column {column}: expected {expected}, found {found}"
    ))
}

fn null(column: &str) -> StoreError {
    StoreError::fatal(format!("column {column} is NULL"))
}

impl Row {
    /// A row of `values`, named by `names` in the same order (drivers share
    /// one `names` among the rows of a result).
    pub fn new(names: Arc<[String]>, values: Vec<Value>) -> Self {
        debug_assert_eq!(names.len(), values.len());
        Self {
            names,
            values,
            next: AtomicUsize::new(0),
        }
    }

    fn index(&self, column: &str) -> Result<usize, StoreError> {
        let count = self.names.len();
        let start = self.next.load(Ordering::Relaxed);
        let index = (0..count)
            .map(|i| (start + i) % count)
            .find(|&i| self.names[i] == column)
            .ok_or_else(|| StoreError::fatal(format!("no column {column} in the row")))?;
        self.next.store(index + 1, Ordering::Relaxed);
        Ok(index)
    }

    fn value(&self, column: &str) -> Result<&Value, StoreError> {
        Ok(&self.values[self.index(column)?])
    }

    /// Text moved out of the row, which keeps NULL in its place: for the
    /// large columns (payloads, headers) a reader takes once, without a
    /// copy.
    pub fn take_text(&mut self, column: &str) -> Result<String, StoreError> {
        let index = self.index(column)?;
        match &mut self.values[index] {
            Value::Text(t) => Ok(std::mem::take(t)),
            Value::Int(n) => Ok(n.to_string()),
            Value::Null => Err(null(column)),
            other => Err(wrong_type(column, "text", other)),
        }
    }

    /// An event's columns (a dialect's `EVENT_COLUMNS`), not yet trusted
    /// as an event: decoding is [`RawEvent::decode`], per row. The text
    /// columns are moved out of the row (a claim reads a thousand
    /// payloads; none is copied). `loose`: the columns take any type
    /// (SQLite), so a number where text belongs reads as its text, NULL as
    /// empty, and an unreadable version as -1; decoding says what is wrong.
    pub fn raw_event(&mut self, loose: bool) -> Result<RawEvent, StoreError> {
        let text = |row: &mut Self, column: &str| match loose {
            true => row.take_loose_text(column),
            false => row.take_text(column),
        };
        Ok(RawEvent {
            sequence: self.int("sequence")?,
            event_id: self.event_id("event_id")?,
            aggregate_type: text(self, "aggregate_type")?,
            aggregate_id: text(self, "aggregate_id")?,
            event_type: text(self, "event_type")?,
            partition_key: text(self, "partition_key")?,
            payload: text(self, "payload")?,
            payload_version: match loose {
                true => self.int("payload_version").unwrap_or(-1),
                false => self.int("payload_version")?,
            },
            headers: text(self, "headers")?,
            created_at: self.time("created_at")?,
            available_at: self.time("available_at")?,
            attempts: self.int("attempts")?,
        })
    }

    /// Whether the row has `column`.
    pub fn has(&self, column: &str) -> bool {
        self.names.iter().any(|n| n == column)
    }

    /// Text moved out of the row whatever the column holds: a number as
    /// its text, NULL as empty (SQLite columns take any type; a row another
    /// tool wrote is read as far as it goes, and its decoding says what is
    /// wrong).
    pub fn take_loose_text(&mut self, column: &str) -> Result<String, StoreError> {
        let index = self.index(column)?;
        match &mut self.values[index] {
            Value::Text(t) => Ok(std::mem::take(t)),
            Value::Int(n) => Ok(n.to_string()),
            Value::Null => Ok(String::new()),
            other => Err(wrong_type(column, "text", other)),
        }
    }

    /// A nullable integer.
    pub fn opt_int(&self, column: &str) -> Result<Option<i64>, StoreError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Int(n) => Ok(Some(*n)),
            // A DECIMAL (what MySQL's SUM gives) travels as text.
            Value::Text(t) => t
                .parse()
                .map(Some)
                .map_err(|_| StoreError::fatal(format!("column {column} is not an integer"))),
            other => Err(wrong_type(column, "an integer", other)),
        }
    }

    /// An integer.
    pub fn int(&self, column: &str) -> Result<i64, StoreError> {
        self.opt_int(column)?.ok_or_else(|| null(column))
    }

    /// A count: NULL (an empty aggregate) is zero.
    pub fn count(&self, column: &str) -> Result<u64, StoreError> {
        Ok(self.opt_int(column)?.unwrap_or(0).max(0) as u64)
    }

    /// A boolean (or an integer, nonzero for true).
    pub fn bool(&self, column: &str) -> Result<bool, StoreError> {
        match self.value(column)? {
            Value::Bool(b) => Ok(*b),
            Value::Null => Err(null(column)),
            _ => Ok(self.int(column)? != 0),
        }
    }

    /// Nullable text, as UTF-8.
    pub fn opt_text(&self, column: &str) -> Result<Option<String>, StoreError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Int(n) => Ok(Some(n.to_string())),
            Value::Text(t) => Ok(Some(t.clone())),
            other => Err(wrong_type(column, "text", other)),
        }
    }

    /// Text, as UTF-8.
    pub fn text(&self, column: &str) -> Result<String, StoreError> {
        self.opt_text(column)?.ok_or_else(|| null(column))
    }

    /// A nullable event id (a `uuid`, or text).
    pub fn opt_event_id(&self, column: &str) -> Result<Option<EventId>, StoreError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Uuid(u) => Ok(Some(EventId::from_uuid(*u))),
            Value::Text(t) => t
                .parse()
                .map(Some)
                .map_err(|e| StoreError::fatal(format!("stored event id {t:?}: {e}"))),
            other => Err(wrong_type(column, "an event id", other)),
        }
    }

    /// An event id (a `uuid`, or text).
    pub fn event_id(&self, column: &str) -> Result<EventId, StoreError> {
        self.opt_event_id(column)?.ok_or_else(|| null(column))
    }

    /// A nullable time (a `timestamptz`, or microseconds since the epoch).
    pub fn opt_time(&self, column: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Time(t) => Ok(Some(*t)),
            Value::Int(micros) => from_micros(*micros).map(Some),
            other => Err(wrong_type(column, "a time", other)),
        }
    }

    /// A time (a `timestamptz`, or microseconds since the epoch).
    pub fn time(&self, column: &str) -> Result<DateTime<Utc>, StoreError> {
        self.opt_time(column)?.ok_or_else(|| null(column))
    }

    /// A text array; NULL is empty.
    pub fn texts(&self, column: &str) -> Result<Vec<String>, StoreError> {
        match self.value(column)? {
            Value::Null => Ok(Vec::new()),
            Value::Texts(t) => Ok(t.clone()),
            other => Err(wrong_type(column, "a text array", other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(values: Vec<Value>) -> Row {
        let names: Arc<[String]> = (0..values.len()).map(|i| format!("c{i}")).collect();
        Row::new(names, values)
    }

    #[test]
    fn each_dialect_s_way_of_storing_reads_the_same() {
        let id = EventId::random();
        let at = from_micros(1_700_000_000_123_456).unwrap();
        let mysql = row(vec![
            Value::Int(1),
            Value::Text(id.to_string()),
            Value::Int(1_700_000_000_123_456),
            Value::Text("42".into()),
        ]);
        let postgres = row(vec![
            Value::Bool(true),
            Value::Uuid(*id.as_uuid()),
            Value::Time(at),
            Value::Int(42),
        ]);
        for r in [mysql, postgres] {
            assert!(r.bool("c0").unwrap());
            assert_eq!(r.event_id("c1").unwrap(), id);
            assert_eq!(r.time("c2").unwrap(), at);
            assert_eq!(r.int("c3").unwrap(), 42);
        }
    }

    #[test]
    fn a_value_of_the_wrong_kind_is_an_error_that_names_the_column() {
        let r = row(vec![
            Value::Bytes(vec![0xff]),
            Value::Null,
            Value::Bool(true),
        ]);
        let error = r.text("c0").unwrap_err().to_string();
        assert!(error.contains("c0") && error.contains("UTF-8"), "{error}");
        assert!(r.int("c1").unwrap_err().to_string().contains("NULL"));
        assert_eq!(r.count("c1").unwrap(), 0);
        assert!(r.int("c2").is_err());
        assert!(
            r.time("nope")
                .unwrap_err()
                .to_string()
                .contains("no column")
        );
    }

    #[test]
    fn text_taken_out_of_a_row_leaves_the_other_columns_readable() {
        let mut r = row(vec![Value::Int(7), Value::Text("payload".into())]);
        assert_eq!(r.take_text("c1").unwrap(), "payload");
        assert_eq!(r.text("c1").unwrap(), "");
        assert_eq!(r.int("c0").unwrap(), 7);
        assert_eq!(r.int("c0").unwrap(), 7, "a column read twice");
        assert!(
            r.clone().take_text("c0").is_ok(),
            "an integer reads as text"
        );
    }
}
