//! What both dialects' drivers share: the connection wrapper the
//! protocols run statements on and the pool as a driver, with the
//! transaction begun and committed through Diesel's transaction manager.
//! Each dialect's `driver.rs` binds parameters and maps rows.

/// A diesel-async connection the protocol runs statements on: pooled, in
/// a transaction, or the caller's `&mut` connection.
pub(crate) struct Diesel<C>(pub(crate) C);

/// `DieselDriver`: a deadpool pool of `$connection`s as the protocol's
/// driver, with a pooled connection, a transaction begun on it and
/// committed. A macro, not a generic type: the pool's bounds on a generic
/// connection name deadpool's `Manager`, which diesel-async does not
/// re-export.
macro_rules! diesel_driver {
    ($connection:ty) => {
        /// A deadpool pool of the dialect's connections as the protocol's driver.
        #[derive(Clone)]
        pub(crate) struct DieselDriver(
            pub(crate) diesel_async::pooled_connection::deadpool::Pool<$connection>,
        );

        type Pooled = diesel_async::pooled_connection::deadpool::Object<$connection>;

        impl DieselDriver {
            /// A pooled connection; a pool that cannot give one is unavailable.
            pub(crate) async fn conn(&self) -> Result<Pooled, outbox_core::StoreError> {
                self.0
                    .get()
                    .await
                    .map_err(|e| outbox_core::StoreError::Unavailable(Box::new(e)))
            }

            /// `conn` with a transaction open. Diesel's transaction manager
            /// knows it: dropped uncommitted, the connection counts as
            /// broken and the pool discards it (the server rolls back).
            async fn begin_on(
                mut conn: Pooled,
            ) -> Result<$crate::driver::Diesel<Pooled>, outbox_core::StoreError> {
                use diesel_async::TransactionManager;
                diesel_async::AnsiTransactionManager::begin_transaction(&mut *conn)
                    .await
                    .store()?;
                Ok($crate::driver::Diesel(conn))
            }

            /// Commits what [`Self::begin_on`] opened.
            async fn commit_on(
                mut tx: $crate::driver::Diesel<Pooled>,
            ) -> Result<(), outbox_core::StoreError> {
                use diesel_async::TransactionManager;
                diesel_async::AnsiTransactionManager::commit_transaction(&mut *tx.0)
                    .await
                    .store()
            }
        }
    };
}
pub(crate) use diesel_driver;
