//! [`MySqlInbox`]: the inbox on MySQL/MariaDB, in the consumer's own transaction.

use sqlx::{MySql, MySqlConnection};

use super::store::MySqlStore;
use crate::inbox::{SqlxInbox, protocol_inbox};

/// The inbox table of a [`MySqlStore`]. A duplicate claim is a plain insert
/// failing on the primary key: MySQL undoes just that statement, and
/// (unlike `INSERT IGNORE`) no other error is turned into a warning.
pub type MySqlInbox = SqlxInbox<MySqlStore>;

impl MySqlStore {
    /// The inbox sharing this store's pool and names.
    pub fn inbox(&self) -> MySqlInbox {
        SqlxInbox::of(self.clone())
    }
}

protocol_inbox!(MySqlStore, MySql, MySqlConnection);
