//! [`Param`](crate::param::Param): a scalar statement parameter (MySQL, SQLite).

/// A statement parameter of the dialects that bind scalars only (MySQL,
/// SQLite): their statements take batches as JSON text.
#[derive(Clone, Debug, PartialEq)]
pub enum Param {
    /// A BIGINT (or any integer column).
    Int(i64),
    /// Text (also JSON documents, event ids).
    Text(String),
    /// A boolean (MySQL: TINYINT(1); SQLite: an INTEGER 0 or 1).
    Bool(bool),
    /// SQL NULL in an integer position.
    Null,
}

/// `From` conversions of plain values into a dialect's parameter enum:
/// `value => Variant` each, the value converted with `Into`.
macro_rules! param_from {
    ($param:ident: $($value:ty => $variant:ident),+ $(,)?) => {
        $(
            impl From<$value> for $param {
                fn from(value: $value) -> Self {
                    Self::$variant(value.into())
                }
            }
        )+
    };
}
pub(crate) use param_from;

param_from!(Param: i64 => Int, i32 => Int, u32 => Int, bool => Bool, String => Text, &str => Text);

impl From<Option<i64>> for Param {
    fn from(value: Option<i64>) -> Self {
        value.map_or(Self::Null, Self::Int)
    }
}

impl From<Option<String>> for Param {
    fn from(value: Option<String>) -> Self {
        value.map_or(Self::Null, Self::Text)
    }
}

impl From<Option<&str>> for Param {
    fn from(value: Option<&str>) -> Self {
        value.map_or(Self::Null, |t| Self::Text(t.to_owned()))
    }
}

/// A row count as a LIMIT, saturating.
pub fn limit(n: usize) -> Param {
    Param::Int(n.min(i64::MAX as usize) as i64)
}

/// A duration in microseconds (how MySQL and SQLite keep time), saturating.
pub fn micros(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

impl From<outbox_core::EventId> for Param {
    fn from(value: outbox_core::EventId) -> Self {
        Self::Text(value.to_string())
    }
}
