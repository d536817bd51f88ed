//! MySQL 8 / MariaDB ≥ 10.6 (feature `mysql`).

mod admin;
mod inbox;
use outbox_sql::mysql as queries;
mod row;
mod store;
#[cfg(feature = "testing")]
mod testing;

pub use inbox::MySqlInbox;
pub use store::MySqlStore;
