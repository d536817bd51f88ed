//! PostgreSQL (feature `postgres`).

mod driver;
mod inbox;
mod listen;
mod listen_hub;
mod store;
mod tenants;
#[cfg(feature = "testing")]
mod testing;

/// The version of the schema the store creates; tables of another version
/// are refused by `migrate` (see the CHANGELOG's upgrade notes).
pub use outbox_sql::postgres::SCHEMA_VERSION;

pub use inbox::PgInbox;
pub use listen::PgWakeUp;
pub use listen_hub::PgListenHub;
pub use store::PgStore;
pub use tenants::{
    PgQueryTenants, PgSchemaTenants, PgTenantRelays, PgTenantStores, PgUrlTenantStores,
    PgUrlTenants,
};
#[cfg(feature = "testing")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "testing")))]
pub use testing::{EffectLog, EndToEndDb, RecordEffect};
