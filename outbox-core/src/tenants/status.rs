//! What a fleet says of each tenant while it runs ([`FleetStatus`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};

use super::source::TenantId;

/// Where a tenant's relay is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TenantState {
    /// Its relay is being built (store connected and checked).
    Starting,
    /// Its relay runs.
    Running,
    /// Its relay could not start or stopped on an error; it is tried
    /// again at `retry_at` (wall clock).
    Retrying {
        /// Failures in a row.
        failures: u32,
        /// The last error, as text.
        error: String,
        /// When it is tried again.
        retry_at: DateTime<Utc>,
    },
    /// Removed from the source: its relay finishes its batch in flight.
    Stopping,
}

/// One tenant's line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantStatus {
    /// Where its relay is.
    pub state: TenantState,
    /// Times its relay was started (restarts included).
    pub starts: u32,
}

/// The fleet's view of every tenant, shared with whoever reports it (a
/// health endpoint, `status`). Clones share it.
#[derive(Clone, Debug, Default)]
pub struct FleetStatus {
    inner: Arc<Mutex<StatusInner>>,
}

#[derive(Debug, Default)]
struct StatusInner {
    tenants: BTreeMap<TenantId, TenantStatus>,
    source_error: Option<String>,
}

impl FleetStatus {
    fn with<T>(&self, read: impl FnOnce(&mut StatusInner) -> T) -> T {
        read(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Every tenant the fleet knows now, by id.
    pub fn tenants(&self) -> BTreeMap<TenantId, TenantStatus> {
        self.with(|s| s.tenants.clone())
    }

    /// One tenant's line, if the fleet knows it.
    pub fn tenant(&self, tenant: &TenantId) -> Option<TenantStatus> {
        self.with(|s| s.tenants.get(tenant).cloned())
    }

    /// The last read of the tenant source failed with this (the fleet goes
    /// on with the tenants it had).
    pub fn source_error(&self) -> Option<String> {
        self.with(|s| s.source_error.clone())
    }

    pub(super) fn set_source_error(&self, error: Option<String>) {
        self.with(|s| s.source_error = error);
    }

    pub(super) fn starting(&self, tenant: &TenantId) {
        self.with(|s| {
            let line = s.tenants.entry(tenant.clone()).or_insert(TenantStatus {
                state: TenantState::Starting,
                starts: 0,
            });
            line.state = TenantState::Starting;
            line.starts += 1;
        });
    }

    pub(super) fn set(&self, tenant: &TenantId, state: TenantState) {
        self.with(|s| {
            if let Some(line) = s.tenants.get_mut(tenant) {
                line.state = state;
            }
        });
    }

    pub(super) fn forget(&self, tenant: &TenantId) {
        self.with(|s| s.tenants.remove(tenant));
    }
}
