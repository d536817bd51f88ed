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

        $crate::__forward_to_field! {
            $crate::__private::store::OutboxWriter, $store, $field {
                fn enqueue(events: &[$crate::__private::NewEvent])
                    -> Vec<$crate::__private::store::EnqueueOutcome>;
            }
        }

        $crate::__forward_to_field! {
            $crate::__private::store::OutboxStore, $store, $field {
                fn claim_batch(request: &$crate::__private::store::ClaimRequest)
                    -> $crate::__private::store::ClaimedBatch;
                fn ack(leases: &[$crate::__private::store::Lease])
                    -> $crate::__private::store::SettleReport;
                fn nack(nacks: &[$crate::__private::store::Nack])
                    -> $crate::__private::store::SettleReport;
                fn release(releases: &[$crate::__private::store::Release])
                    -> $crate::__private::store::SettleReport;
                fn heartbeat(beat: &$crate::__private::store::Heartbeat) -> ();
            }
        }

        $crate::__forward_to_field! {
            $crate::__private::store::OutboxAdmin, $store, $field {
                fn stats() -> Vec<$crate::__private::store::EventTypeStats>;
                fn held_back() -> Vec<$crate::__private::store::HeldBack>;
                fn event_state(event_id: $crate::__private::EventId)
                    -> Option<$crate::__private::store::EventState>;
                fn failed_events(limit: usize) -> Vec<$crate::__private::store::FailedEvent>;
                fn failed_page(page: &$crate::__private::store::FailedPage)
                    -> Vec<$crate::__private::store::FailedEvent>;
                fn count_failed(page: &$crate::__private::store::FailedPage)
                    -> $crate::__private::store::FailedCount;
                fn failed_event(event_id: $crate::__private::EventId)
                    -> Option<$crate::__private::store::FailedEvent>;
                fn last_sequence() -> Option<i64>;
                fn history(event_id: $crate::__private::EventId)
                    -> Vec<$crate::__private::store::AttemptRecord>;
                fn blocked_keys() -> Vec<$crate::__private::store::BlockedKey>;
                fn requeue(
                    event_id: $crate::__private::EventId,
                    action: &$crate::__private::store::OperatorAction
                ) -> ();
                fn skip(
                    event_id: $crate::__private::EventId,
                    action: &$crate::__private::store::OperatorAction
                ) -> ();
                fn requeue_each(
                    event_ids: &[$crate::__private::EventId],
                    action: &$crate::__private::store::OperatorAction
                ) -> Vec<$crate::__private::EventId>;
                fn skip_each(
                    event_ids: &[$crate::__private::EventId],
                    action: &$crate::__private::store::OperatorAction
                ) -> Vec<$crate::__private::EventId>;
                fn supersede(
                    event_id: $crate::__private::EventId,
                    replacement: $crate::__private::NewEvent,
                    action: &$crate::__private::store::OperatorAction
                ) -> $crate::__private::store::EnqueueOutcome;
                fn purge_published(older_than: ::std::time::Duration, batch_size: usize) -> u64;
                fn relays() -> Vec<$crate::__private::store::RelayStatus>;
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

/// `$trait` for `$store`, each listed method (its arguments after `&self`,
/// and what its `Ok` holds) handed to the same method of field `$field`;
/// what [`delegate_sql_store!`] writes with. Not part of the API.
#[doc(hidden)]
#[macro_export]
macro_rules! __forward_to_field {
    ($trait:path, $store:ty, $field:ident {
        $(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ok:ty;)*
    }) => {
        #[$crate::__private::async_trait]
        impl $trait for $store {
            $(
                async fn $name(&self, $($arg: $ty),*) -> Result<$ok, $crate::__private::StoreError> {
                    <_ as $trait>::$name(&self.$field, $($arg),*).await
                }
            )*
        }
    };
}

/// Implements a driver crate's `InboxDialect` for `$store`, whose
/// `protocol` field (a dialect's `Protocol` over the crate's driver) holds
/// the inbox statements: the inbox table's name, a claim written on the
/// caller's connection `$conn` (wrapped for the protocol as `$exec`) and
/// the purge are the same for every store of every driver crate; `$items`
/// are the crate's own (its associated types, how a transaction begins).
#[macro_export]
macro_rules! protocol_inbox_dialect {
    (
        $store:ty: $dialect:path { $($items:tt)* }
        claims on $connection:ty as |$conn:ident| $exec:expr
    ) => {
        #[$crate::__private::async_trait]
        impl $dialect for $store {
            $($items)*

            fn inbox_table(&self) -> String {
                self.config().tables.inbox()
            }

            async fn claim_on(
                &self,
                $conn: &mut $connection,
                consumer: &str,
                event_id: $crate::__private::EventId,
            ) -> Result<bool, $crate::__private::StoreError> {
                self.protocol.inbox_claim(&mut $exec, consumer, event_id).await
            }

            async fn purge_inbox(
                &self,
                older_than: ::std::time::Duration,
                batch_size: usize,
            ) -> Result<u64, $crate::__private::StoreError> {
                self.protocol.inbox_purge(older_than, batch_size).await
            }
        }
    };
}
