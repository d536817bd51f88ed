//! [`PgInbox`]: the inbox on PostgreSQL through diesel-async (`&mut *tx`
//! is an `AsyncPgConnection`).

use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::deadpool::Object;

use super::store::PgStore;
use crate::inbox::{DieselInbox, DieselInboxTx, protocol_inbox};

/// The inbox table of a [`PgStore`]. A concurrent claim of the same event
/// waits on the primary key until the first commits, then finds the row
/// and inserts nothing.
pub type PgInbox = DieselInbox<PgStore>;

/// A pooled `AsyncPgConnection` inside the inbox's open transaction.
pub type PgInboxTx = DieselInboxTx<Object<AsyncPgConnection>>;

impl PgStore {
    /// The inbox sharing this store's pool and names.
    pub fn inbox(&self) -> PgInbox {
        DieselInbox::of(self.clone())
    }
}

protocol_inbox!(PgStore, AsyncPgConnection);
