//! [`MysqlInbox`]: the inbox on MySQL/MariaDB through diesel-async
//! (`&mut *tx` is an `AsyncMysqlConnection`).

use diesel_async::AsyncMysqlConnection;
use diesel_async::pooled_connection::deadpool::Object;

use super::store::MysqlStore;
use crate::inbox::{DieselInbox, DieselInboxTx, protocol_inbox};

/// The inbox table of a [`MysqlStore`]. A duplicate claim is a plain
/// insert failing on the primary key: MySQL undoes just that statement, and
/// your transaction goes on; a concurrent claim of the same event waits on
/// the primary key until the first commits, then fails as a duplicate.
pub type MysqlInbox = DieselInbox<MysqlStore>;

/// A pooled `AsyncMysqlConnection` inside the inbox's open transaction.
pub type MysqlInboxTx = DieselInboxTx<Object<AsyncMysqlConnection>>;

impl MysqlStore {
    /// The inbox sharing this store's pool and names.
    pub fn inbox(&self) -> MysqlInbox {
        DieselInbox::of(self.clone())
    }
}

protocol_inbox!(MysqlStore, AsyncMysqlConnection);
