//! MySQL 8 / MariaDB ≥ 10.6 (feature `mysql`).

mod driver;
mod inbox;
mod store;
mod tenants;
#[cfg(feature = "testing")]
mod testing;

pub use inbox::MySqlInbox;
/// The version of the schema the store creates; tables of another version
/// are refused by `migrate` (see the CHANGELOG's upgrade notes).
pub use outbox_sql::mysql::SCHEMA_VERSION;
pub use store::MySqlStore;
pub use tenants::{
    MySqlDatabaseTenants, MySqlQueryTenants, MySqlTenantRelays, MySqlTenantStores,
    MySqlUrlTenantStores, MySqlUrlTenants,
};
