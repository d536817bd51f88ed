//! Where events go and how streams are trimmed.

use outbox_core::publisher::PrefixRoutes;
use std::time::Duration;

/// Chooses the stream key for an event type: `{prefix}{event_type}` unless
/// an override names another stream.
#[derive(Clone, Debug)]
pub struct StreamRouter {
    routes: PrefixRoutes,
}

impl StreamRouter {
    /// Streams named `{prefix}{event_type}`, e.g. prefix `outbox:` gives
    /// `outbox:invoice.paid`.
    pub fn with_prefix(prefix: impl Into<String>) -> Self {
        let routes = PrefixRoutes::with_prefix(prefix);
        Self { routes }
    }

    /// Sends `event_type` to `stream` instead.
    pub fn route(mut self, event_type: impl Into<String>, stream: impl Into<String>) -> Self {
        self.routes.route(event_type, stream);
        self
    }

    /// The stream for `event_type`.
    pub fn stream_for(&self, event_type: &str) -> String {
        self.routes.destination_for(event_type)
    }

    /// The routing in a few words, for operators: `outbox:<event type>`.
    pub(crate) fn describe(&self) -> String {
        self.routes.describe()
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
