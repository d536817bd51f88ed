//! PostgreSQL's fault seams over any driver (feature `testing`).

use async_trait::async_trait;
use outbox_core::testing::OpenWrite;
use outbox_core::{EventId, StoreError};

use super::{Driver, Exec, Param, Protocol};
use crate::testing::SeamsProtocol;

dialect_write!();
dialect_slow_ack!(|protocol| protocol.driver.begin());

#[async_trait]
impl<D: Driver> SeamsProtocol for Protocol<D> {
    async fn begin_write(&self) -> Result<Box<dyn OpenWrite>, StoreError> {
        let tx = self.driver.begin().await?;
        // What a business UPDATE does to the transaction: it gets its id.
        let business_write = "SELECT pg_current_xact_id()::text AS xid";
        Ok(open_write(self, tx, business_write))
    }

    async fn write_unreadable_row(&self, partition_key: &str) -> EventId {
        // Valid SQL, passes the table's checks, and is no event.
        let id = EventId::random();
        let insert = format!(
            "INSERT INTO {} (event_id, aggregate_type, aggregate_id, event_type, partition_key,
                 payload, headers)
             VALUES ($1, 'bad', $2, 'bad.row', $2, '{{}}', '{{\"traceparent\": 5}}')",
            self.config.tables.events()
        );
        let mut conn = self.driver.connect().await.expect("a connection");
        conn.execute(&insert, vec![id.into(), Param::Text(partition_key.into())])
            .await
            .expect("insert an unreadable row");
        id
    }
}
