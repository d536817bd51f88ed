//! Rests between batches: how a fleet keeps one tenant's backlog from
//! taking the server from the others.

use std::time::Duration;

/// A batch a relay has just published and settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchDone {
    /// Events the claim returned.
    pub events: usize,
    /// Whether the claim filled the batch (the store had more: a backlog).
    pub full: bool,
    /// From the batch's start to its settlement (with prefetch, the next
    /// claim ran meanwhile).
    pub busy: Duration,
}

/// Decides how long a relay rests after a batch before its next claim.
///
/// A relay alone never rests ([`FullSpeed`]). A
/// [`TenantFleet`](crate::tenants::TenantFleet) gives each tenant's relay
/// one that rests a tenant draining a backlog while another tenant serves
/// fresh events (see [`FairShare`](crate::tenants::FairShare)).
pub trait Pace: Send + Sync {
    /// The rest after `batch` (zero: claim again at once).
    fn rest_after(&self, batch: &BatchDone) -> Duration;
}

/// Never rests.
#[derive(Debug, Default, Clone, Copy)]
pub struct FullSpeed;

impl Pace for FullSpeed {
    fn rest_after(&self, _: &BatchDone) -> Duration {
        Duration::ZERO
    }
}
