//! [`PgInbox`]: the inbox on PostgreSQL, in the consumer's own transaction.

use sqlx::{PgConnection, Postgres};

use super::store::PgStore;
use crate::inbox::{SqlxInbox, protocol_inbox};

/// The inbox table of a [`PgStore`]. The transaction is a plain
/// `sqlx::Transaction`: write your effect through it, then commit. A
/// concurrent claim of the same event waits on the primary key until the
/// first commits, then finds the row and inserts nothing.
pub type PgInbox = SqlxInbox<PgStore>;

impl PgStore {
    /// The inbox sharing this store's pool and names.
    pub fn inbox(&self) -> PgInbox {
        SqlxInbox::of(self.clone())
    }
}

protocol_inbox!(PgStore, Postgres, PgConnection);
