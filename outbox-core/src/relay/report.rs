//! What a relay did, returned when it stops.

/// Totals over a relay's run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Events acknowledged as published.
    pub published: u64,
    /// Transient failures scheduled for retry.
    pub retried: u64,
    /// Events moved to `failed` (permanent, exhausted, crash loop).
    pub failed: u64,
    /// Settlements refused because another claim held the row.
    pub fenced: u64,
    /// Leases returned without an outcome (outage, shutdown, short lease).
    pub released: u64,
    /// Broker outages that paused the relay.
    pub outages: u64,
    /// Store errors the relay backed off from.
    pub store_errors: u64,
    /// False when shutdown's drain timeout cut the last batch short.
    pub drained: bool,
}

/// Adds another relay's totals (several relays over one store); `drained`
/// holds only if both drained.
impl std::ops::AddAssign<&RelayReport> for RelayReport {
    fn add_assign(&mut self, other: &RelayReport) {
        self.published += other.published;
        self.retried += other.retried;
        self.failed += other.failed;
        self.fenced += other.fenced;
        self.released += other.released;
        self.outages += other.outages;
        self.store_errors += other.store_errors;
        self.drained &= other.drained;
    }
}

/// A relay that stopped on its own: a store error retrying cannot cure
/// (tables never migrated, the wrong database, permission denied). Fix the
/// cause and start it again; nothing was lost (unsettled leases expire).
#[derive(Debug, thiserror::Error)]
#[error("relay stopped: {error}")]
pub struct RelayError {
    /// The store's error (said in this error's text, so not also its
    /// `source`).
    pub error: crate::error::StoreError,
    /// What the relay did before it stopped.
    pub report: RelayReport,
}
