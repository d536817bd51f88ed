//! The rows a per-key claim sets aside, on SQLite (`support::set_aside`):
//! status 4 and 5 are outside the claim's partial live index.

use async_trait::async_trait;
use outbox_core::{EventId, ManualClock};
use outbox_sqlx::StoreConfig;
use outbox_sqlx::sqlite::SqliteStore;

use super::support::set_aside::SetAsideHarness;

#[async_trait]
impl SetAsideHarness for SqliteStore {
    async fn create(clock: ManualClock) -> Self {
        super::store_on(clock).await
    }

    async fn statuses(&self, key: &str) -> Vec<(i64, i64)> {
        sqlx::query_as(
            "SELECT status, COUNT(*) FROM outbox_events
             WHERE partition_key = ? GROUP BY status ORDER BY status",
        )
        .bind(key)
        .fetch_all(self.pool())
        .await
        .unwrap()
    }

    async fn by_hand(&self, sql: &str, id: EventId) {
        sqlx::query(&sql.replace("{events}", "outbox_events"))
            .bind(id.to_string())
            .execute(self.pool())
            .await
            .unwrap();
    }

    fn reopened(&self) -> Self {
        SqliteStore::new(self.pool().clone(), StoreConfig::default()).unwrap()
    }
}

crate::set_aside_tests!(SqliteStore);
