//! SQLite (feature `sqlite`).

mod admin;
mod inbox;
use outbox_sql::sqlite as queries;
mod relay;
mod row;
mod store;
#[cfg(feature = "testing")]
mod testing;

pub use inbox::SqliteInbox;
pub use store::SqliteStore;
