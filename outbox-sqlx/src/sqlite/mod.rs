//! SQLite (feature `sqlite`): `outbox-sql`'s SQLite protocol over sqlx.

mod driver;
mod inbox;
mod store;
#[cfg(feature = "testing")]
mod testing;

pub use inbox::SqliteInbox;
pub use store::SqliteStore;
