//! What a relay tells the store about itself: that it is alive, and whether
//! it is paused because its broker is down.

use super::lease::RelayId;

/// Longest [`PublisherOutage::reason`] a store keeps, in characters: a
/// broker's error can carry a whole response body; operators need its start.
pub const OUTAGE_REASON_MAX_CHARS: usize = 1000;

/// Longest [`PublisherOutage::destination`] a store keeps, in characters
/// (MySQL keeps it in a `VARCHAR(255)`).
pub const OUTAGE_DESTINATION_MAX_CHARS: usize = 255;

/// A relay's sign of life, written by [`OutboxStore::heartbeat`](super::OutboxStore::heartbeat)
/// every `heartbeat_interval` and whenever an outage begins, changes or
/// ends, so `status`, `health` and [`OutboxAdmin::relays`](super::OutboxAdmin::relays)
/// see a paused relay within one batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    /// The relay.
    pub relay: RelayId,
    /// Set while the relay is paused because its publisher reports an
    /// outage (the store keeps when it first saw it); `None` clears it.
    pub outage: Option<PublisherOutage>,
}

impl Heartbeat {
    /// A relay at work.
    pub fn alive(relay: RelayId) -> Self {
        Self {
            relay,
            outage: None,
        }
    }

    /// A relay paused by a publisher outage.
    pub fn in_outage(relay: RelayId, outage: PublisherOutage) -> Self {
        Self {
            relay,
            outage: Some(outage),
        }
    }
}

/// Why a relay is paused: its publisher answered
/// [`PublishError::outage`](crate::PublishError::outage).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublisherOutage {
    /// Where it publishes ([`Publisher::destination`](crate::Publisher::destination)).
    pub destination: String,
    /// The publisher's error.
    pub reason: String,
}

impl PublisherOutage {
    /// An outage of `destination`; both texts are cut to what a store keeps
    /// ([`OUTAGE_DESTINATION_MAX_CHARS`], [`OUTAGE_REASON_MAX_CHARS`]), a cut
    /// reason ending in `…`.
    pub fn new(destination: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            destination: cut(destination.into(), OUTAGE_DESTINATION_MAX_CHARS),
            reason: cut(reason.into(), OUTAGE_REASON_MAX_CHARS),
        }
    }
}

/// `text` cut to `max` characters (on a character boundary), the last one
/// replaced by `…` when cut: a diagnostic, never data.
fn cut(text: String, max: usize) -> String {
    if text.chars().count() <= max {
        return text;
    }
    let mut kept: String = text.chars().take(max - 1).collect();
    kept.push('…');
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_reasons_are_cut_where_a_store_can_keep_them() {
        let outage = PublisherOutage::new("kafka ä".repeat(100), "é".repeat(5000));
        assert_eq!(outage.reason.chars().count(), OUTAGE_REASON_MAX_CHARS);
        assert!(outage.reason.ends_with('…'));
        assert_eq!(
            outage.destination.chars().count(),
            OUTAGE_DESTINATION_MAX_CHARS
        );
        let short = PublisherOutage::new("redis 127.0.0.1:6379", "connection refused");
        assert_eq!(short.reason, "connection refused");
        assert_eq!(short.destination, "redis 127.0.0.1:6379");
    }
}
