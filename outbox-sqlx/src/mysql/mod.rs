//! MySQL 8 / MariaDB ≥ 10.6 (feature `mysql`).

mod admin;
mod inbox;
mod queries;
mod row;
mod store;
#[cfg(feature = "testing")]
mod testing;

pub use inbox::MySqlInbox;
pub use store::MySqlStore;
