//! [`SqliteInbox`]: the inbox on SQLite, in the consumer's own transaction.

use sqlx::Sqlite;

use super::store::SqliteStore;
use crate::inbox::SqlxInbox;

/// The inbox table of a [`SqliteStore`]. Its transactions begin `IMMEDIATE`
/// so the claim and your effect never meet a stale snapshot.
pub type SqliteInbox = SqlxInbox<SqliteStore>;

impl SqliteStore {
    /// The inbox sharing this store's pool and names.
    pub fn inbox(&self) -> SqliteInbox {
        SqlxInbox::of(self.clone())
    }
}

crate::inbox::protocol_inbox!(SqliteStore, Sqlite, sqlx::SqliteConnection, |store| {
    // Before the write lock is taken: syncing the test clock writes.
    store.sync_clock().await?;
    store.begin_immediate().await
});
