//! Many outboxes in one process: a relay per tenant (a database or a
//! schema each), started and stopped as the tenant list changes, each
//! failing and retrying on its own.
//!
//! A [`TenantSource`] says which tenants there are (a fixed list, a
//! [`TenantList`] the application edits, the schemas of a database, the
//! rows of a tenants table); a [`TenantRelayFactory`] builds one tenant's
//! relay (its store on the tenant's database or schema, sharing a pool
//! with the other tenants of the same server; its publisher; its
//! settings). [`TenantFleet`] re-reads the source every
//! [`FleetConfig::refresh`], starts a relay for each new tenant, lets a
//! removed tenant's relay finish its batch in flight and stop, and retries
//! a tenant whose relay cannot start or stops on an error after a backoff
//! of its own: one tenant's broken database, missing tables or wrong
//! credentials never hold another's events. A tenant draining a backlog
//! rests between batches while others are served ([`FairShare`]): one
//! tenant's million events do not take the server from another's one.

mod fleet;
mod share;
mod source;
mod status;
#[cfg(test)]
mod tests;

pub use fleet::{FleetConfig, FleetReport, TenantFleet, TenantRelayFactory};
pub use share::FairShare;
pub use source::{InvalidTenantId, MAX_TENANT_ID_LEN, TenantId, TenantList, TenantSource};
pub use status::{FleetStatus, TenantState, TenantStatus};
