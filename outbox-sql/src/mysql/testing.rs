//! MySQL's fault seams over any driver (feature `testing`).

use async_trait::async_trait;
use outbox_core::testing::OpenWrite;
use outbox_core::{EventId, StoreError};

use super::{Driver, Exec, Protocol};
use crate::testing::SeamsProtocol;

dialect_write!();
dialect_slow_ack!(|protocol| protocol.begin_relay());

#[async_trait]
impl<D: Driver> SeamsProtocol for Protocol<D> {
    /// At the server's default isolation (REPEATABLE READ), as business
    /// code opens one; its business rows go to a table of their own.
    async fn begin_write(&self) -> Result<Box<dyn OpenWrite>, StoreError> {
        let business = self.config.tables.table("test_business");
        // DDL commits implicitly in MySQL: the table comes first.
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {business} \
             (id BIGINT AUTO_INCREMENT PRIMARY KEY, note TEXT) ENGINE = InnoDB"
        );
        self.driver
            .connect()
            .await?
            .execute(&create, Vec::new())
            .await?;
        let tx = self.driver.begin(false).await?;
        let business_write = format!("INSERT INTO {business} (note) VALUES ('paid')");
        Ok(open_write(self, tx, &business_write))
    }

    async fn write_unreadable_row(&self, partition_key: &str) -> EventId {
        // Valid SQL, and no event: a header that is not a string.
        let id = EventId::random();
        let mut conn = self.driver.connect().await.expect("a connection");
        let now = self.now(&mut conn).await.expect("store time");
        let insert = format!(
            "INSERT INTO {} (event_id, aggregate_type, aggregate_id, event_type, partition_key,
                 payload, payload_version, headers, created_at, available_at)
             VALUES (?, 'bad', ?, 'bad.row', ?, '{{}}', 1, '{{\"traceparent\": 5}}', ?, ?)",
            self.config.tables.events()
        );
        let (key, id_text) = (partition_key.to_owned(), id.to_string());
        let params = vec![
            id_text.into(),
            key.clone().into(),
            key.into(),
            now.into(),
            now.into(),
        ];
        conn.execute(&insert, params)
            .await
            .expect("insert an unreadable row");
        id
    }
}
