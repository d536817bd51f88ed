//! SQLite (feature `sqlite`).

mod admin;
mod inbox;
mod queries;
mod row;
mod store;

pub use inbox::SqliteInbox;
pub use store::SqliteStore;
