//! The stores a daemon serves: one, or every running tenant's of a fleet;
//! what reads them beside the relays (the backlog gauges, the scheduled
//! purge) goes over them the same way.

use outbox_core::StoreError;
use outbox_core::tenants::{FleetStatus, TenantId, TenantState};

use crate::store::{Store, StoreOf};

/// The stores a daemon serves.
#[derive(Clone)]
pub enum Served {
    /// One store.
    Store(Store),
    /// Every tenant of a fleet that is running now.
    Tenants {
        /// Which tenants run.
        fleet: FleetStatus,
        /// A tenant's store.
        store_of: StoreOf,
    },
}

impl Served {
    /// Each store served now, with its tenant (none for one store); a
    /// tenant whose store cannot be made comes with the error.
    pub fn stores(&self) -> Vec<(Option<TenantId>, Result<Store, StoreError>)> {
        match self {
            Self::Store(store) => vec![(None, Ok(store.clone()))],
            Self::Tenants { fleet, store_of } => fleet
                .tenants()
                .into_iter()
                .filter(|(_, status)| matches!(status.state, TenantState::Running))
                .map(|(tenant, _)| {
                    let store = store_of(&tenant);
                    (Some(tenant), store)
                })
                .collect(),
        }
    }
}
