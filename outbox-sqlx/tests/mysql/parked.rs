//! The rows a per-key claim sets aside, on MariaDB/MySQL
//! (`support::set_aside`).

use async_trait::async_trait;
use outbox_core::{EventId, ManualClock};
use outbox_sqlx::mysql::MySqlStore;

use super::support::set_aside::SetAsideHarness;

#[async_trait]
impl SetAsideHarness for MySqlStore {
    async fn create(clock: ManualClock) -> Self {
        super::store_on(clock).await
    }

    async fn statuses(&self, key: &str) -> Vec<(i64, i64)> {
        let events = self.config().tables.events();
        sqlx::query_as(&format!(
            "SELECT CAST(status AS SIGNED), COUNT(*) FROM {events}
             WHERE partition_key = ? GROUP BY status ORDER BY status"
        ))
        .bind(key)
        .fetch_all(self.pool())
        .await
        .unwrap()
    }

    async fn by_hand(&self, sql: &str, id: EventId) {
        let sql = sql.replace("{events}", &self.config().tables.events());
        sqlx::query(&sql)
            .bind(id.to_string())
            .execute(self.pool())
            .await
            .unwrap();
    }

    fn reopened(&self) -> Self {
        MySqlStore::new(self.pool().clone(), self.config().clone())
    }
}

crate::set_aside_tests!(MySqlStore);
