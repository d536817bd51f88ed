//! Where events go and how streams are trimmed.

use std::collections::HashMap;
use std::time::Duration;

/// Chooses the stream key for an event type: `{prefix}{event_type}` unless
/// an override names another stream.
#[derive(Clone, Debug)]
pub struct StreamRouter {
    prefix: String,
    overrides: HashMap<String, String>,
}

impl StreamRouter {
    /// Streams named `{prefix}{event_type}`, e.g. prefix `outbox:` gives
    /// `outbox:invoice.paid`.
    pub fn with_prefix(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            overrides: HashMap::new(),
        }
    }

    /// Sends `event_type` to `stream` instead.
    pub fn route(mut self, event_type: impl Into<String>, stream: impl Into<String>) -> Self {
        self.overrides.insert(event_type.into(), stream.into());
        self
    }

    /// The stream for `event_type`.
    pub fn stream_for(&self, event_type: &str) -> String {
        self.overrides
            .get(event_type)
            .cloned()
            .unwrap_or_else(|| format!("{}{event_type}", self.prefix))
    }

    /// The routing in a few words, for operators: `outbox:<event type>`.
    pub(crate) fn describe(&self) -> String {
        match self.overrides.len() {
            0 => format!("{}<event type>", self.prefix),
            n => format!("{}<event type> ({n} routed elsewhere)", self.prefix),
        }
    }
}

impl Default for StreamRouter {
    fn default() -> Self {
        Self::with_prefix("outbox:")
    }
}

/// Approximate trimming applied with every `XADD` to a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trim {
    /// `MAXLEN ~ n`: keep about the newest `n` entries.
    MaxLen(usize),
    /// `MINID ~ <now - age>`: drop entries older than about `age`.
    MaxAge(Duration),
}
