//! [`delegate_sql_store!`]: an adapter's store type carries the core's
//! store traits of the protocol it wraps, without restating each method.

/// Implements `OutboxStore`, `OutboxWriter` and `OutboxAdmin` for `$store`
/// by handing each call to its protocol field (a dialect's `Protocol`)
/// `$field`: an adapter's store is a named type over the shared protocol.
/// Also gives it what every store shows of itself: `Debug` (its tables),
/// `config()` and `schema_version()`.
#[macro_export]
macro_rules! delegate_sql_store {
    ($store:ident, $field:ident) => {
        impl ::std::fmt::Debug for $store {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($store))
                    .field("tables", &self.$field.config.tables)
                    .finish_non_exhaustive()
            }
        }

        impl $store {
            /// The settings.
            pub fn config(&self) -> &$crate::StoreConfig {
                &self.$field.config
            }

            /// The schema version of the outbox tables: `None` if there are
            /// none, 1 for tables made before the version record existed.
            pub async fn schema_version(
                &self,
            ) -> Result<Option<i32>, $crate::__private::StoreError> {
                self.$field.schema_version().await
            }
        }

        #[$crate::__private::async_trait]
        impl $crate::__private::store::OutboxWriter for $store {
            async fn enqueue(
                &self,
                events: &[$crate::__private::NewEvent],
            ) -> Result<Vec<$crate::__private::store::EnqueueOutcome>, $crate::__private::StoreError>
            {
                $crate::__private::store::OutboxWriter::enqueue(&self.$field, events).await
            }
        }

        #[$crate::__private::async_trait]
        impl $crate::__private::store::OutboxStore for $store {
            async fn claim_batch(
                &self,
                request: &$crate::__private::store::ClaimRequest,
            ) -> Result<$crate::__private::store::ClaimedBatch, $crate::__private::StoreError> {
                $crate::__private::store::OutboxStore::claim_batch(&self.$field, request).await
            }
            async fn ack(
                &self,
                leases: &[$crate::__private::store::Lease],
            ) -> Result<$crate::__private::store::SettleReport, $crate::__private::StoreError> {
                $crate::__private::store::OutboxStore::ack(&self.$field, leases).await
            }
            async fn nack(
                &self,
                nacks: &[$crate::__private::store::Nack],
            ) -> Result<$crate::__private::store::SettleReport, $crate::__private::StoreError> {
                $crate::__private::store::OutboxStore::nack(&self.$field, nacks).await
            }
            async fn release(
                &self,
                releases: &[$crate::__private::store::Release],
            ) -> Result<$crate::__private::store::SettleReport, $crate::__private::StoreError> {
                $crate::__private::store::OutboxStore::release(&self.$field, releases).await
            }
            async fn heartbeat(
                &self,
                beat: &$crate::__private::store::Heartbeat,
            ) -> Result<(), $crate::__private::StoreError> {
                $crate::__private::store::OutboxStore::heartbeat(&self.$field, beat).await
            }
        }

        #[$crate::__private::async_trait]
        impl $crate::__private::store::OutboxAdmin for $store {
            async fn stats(
                &self,
            ) -> Result<Vec<$crate::__private::store::EventTypeStats>, $crate::__private::StoreError>
            {
                self.$field.stats().await
            }
            async fn held_back(
                &self,
            ) -> Result<Vec<$crate::__private::store::HeldBack>, $crate::__private::StoreError> {
                self.$field.held_back().await
            }
            async fn event_state(
                &self,
                event_id: $crate::__private::EventId,
            ) -> Result<Option<$crate::__private::store::EventState>, $crate::__private::StoreError>
            {
                self.$field.event_state(event_id).await
            }
            async fn failed_events(
                &self,
                limit: usize,
            ) -> Result<Vec<$crate::__private::store::FailedEvent>, $crate::__private::StoreError>
            {
                self.$field.failed_events(limit).await
            }
            async fn failed_page(
                &self,
                page: &$crate::__private::store::FailedPage,
            ) -> Result<Vec<$crate::__private::store::FailedEvent>, $crate::__private::StoreError>
            {
                self.$field.failed_page(page).await
            }
            async fn count_failed(
                &self,
                page: &$crate::__private::store::FailedPage,
            ) -> Result<$crate::__private::store::FailedCount, $crate::__private::StoreError>
            {
                self.$field.count_failed(page).await
            }
            async fn failed_event(
                &self,
                event_id: $crate::__private::EventId,
            ) -> Result<Option<$crate::__private::store::FailedEvent>, $crate::__private::StoreError>
            {
                self.$field.failed_event(event_id).await
            }
            async fn last_sequence(
                &self,
            ) -> Result<Option<i64>, $crate::__private::StoreError> {
                self.$field.last_sequence().await
            }
            async fn history(
                &self,
                event_id: $crate::__private::EventId,
            ) -> Result<Vec<$crate::__private::store::AttemptRecord>, $crate::__private::StoreError>
            {
                self.$field.history(event_id).await
            }
            async fn blocked_keys(
                &self,
            ) -> Result<Vec<$crate::__private::store::BlockedKey>, $crate::__private::StoreError>
            {
                self.$field.blocked_keys().await
            }
            async fn requeue(
                &self,
                event_id: $crate::__private::EventId,
                action: &$crate::__private::store::OperatorAction,
            ) -> Result<(), $crate::__private::StoreError> {
                self.$field.requeue(event_id, action).await
            }
            async fn skip(
                &self,
                event_id: $crate::__private::EventId,
                action: &$crate::__private::store::OperatorAction,
            ) -> Result<(), $crate::__private::StoreError> {
                self.$field.skip(event_id, action).await
            }
            async fn requeue_each(
                &self,
                event_ids: &[$crate::__private::EventId],
                action: &$crate::__private::store::OperatorAction,
            ) -> Result<Vec<$crate::__private::EventId>, $crate::__private::StoreError> {
                self.$field.requeue_each(event_ids, action).await
            }
            async fn skip_each(
                &self,
                event_ids: &[$crate::__private::EventId],
                action: &$crate::__private::store::OperatorAction,
            ) -> Result<Vec<$crate::__private::EventId>, $crate::__private::StoreError> {
                self.$field.skip_each(event_ids, action).await
            }
            async fn supersede(
                &self,
                event_id: $crate::__private::EventId,
                replacement: $crate::__private::NewEvent,
                action: &$crate::__private::store::OperatorAction,
            ) -> Result<$crate::__private::store::EnqueueOutcome, $crate::__private::StoreError>
            {
                self.$field.supersede(event_id, replacement, action).await
            }
            async fn purge_published(
                &self,
                older_than: ::std::time::Duration,
                batch_size: usize,
            ) -> Result<u64, $crate::__private::StoreError> {
                self.$field.purge_published(older_than, batch_size).await
            }
            async fn relays(
                &self,
            ) -> Result<Vec<$crate::__private::store::RelayStatus>, $crate::__private::StoreError>
            {
                self.$field.relays().await
            }
        }
    };
}

/// [`delegate_sql_store!`], by the name it had while only MySQL's protocol
/// existed.
#[macro_export]
macro_rules! delegate_mysql_store {
    ($store:ident, $field:ident) => {
        $crate::delegate_sql_store!($store, $field);
    };
}
