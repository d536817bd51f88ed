//! Where events go and how streams are trimmed.

use std::time::Duration;

outbox_core::prefix_router!(
    /// Chooses the stream key for an event type: `{prefix}{event_type}`
    /// unless an override names another stream (default prefix `outbox:`,
    /// giving `outbox:invoice.paid`).
    StreamRouter,
    "stream",
    stream_for,
    default "outbox:"
);

/// Approximate trimming applied with every `XADD` to a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trim {
    /// `MAXLEN ~ n`: keep about the newest `n` entries.
    MaxLen(usize),
    /// `MINID ~ <now - age>`: drop entries older than about `age`.
    MaxAge(Duration),
}
