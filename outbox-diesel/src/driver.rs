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
///
/// Also the protocol's `Driver` trait (`$driver`) for it: a connection, a
/// transaction begun by `begin`'s body (given `self` and its arguments),
/// and a commit.
macro_rules! diesel_driver {
    ($connection:ty, $driver:path, fn begin(&$self:ident $(, $arg:ident: $ty:ty)*) $begin:block) => {
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

        #[async_trait::async_trait]
        impl $driver for DieselDriver {
            type Conn = $crate::driver::Diesel<Pooled>;
            /// Diesel's transaction manager knows the transaction: dropped
            /// uncommitted, the connection counts as broken and the pool
            /// discards it (the server rolls back).
            type Tx = $crate::driver::Diesel<Pooled>;

            async fn connect(&self) -> Result<Self::Conn, outbox_core::StoreError> {
                self.conn().await.map($crate::driver::Diesel)
            }

            async fn begin(&$self $(, $arg: $ty)*) -> Result<Self::Tx, outbox_core::StoreError> $begin

            async fn commit(tx: Self::Tx) -> Result<(), outbox_core::StoreError> {
                DieselDriver::commit_on(tx).await
            }
        }
    };
}
pub(crate) use diesel_driver;

/// In a dialect's `driver.rs` (with its `bind`, `AnyRow`, `Param` and
/// `Row` in scope): `$exec` for [`Diesel`] over `$connection`, its
/// `execute` and `fetch` written here and `$extra` the dialect's own
/// methods.
macro_rules! diesel_exec {
    ($connection:ty, $exec:path { $($extra:tt)* }) => {
        #[async_trait::async_trait]
        impl<C> $exec for $crate::driver::Diesel<C>
        where
            C: std::ops::DerefMut<Target = $connection> + Send,
        {
            async fn execute(
                &mut self,
                sql: &str,
                params: Vec<Param>,
            ) -> Result<u64, outbox_core::StoreError> {
                let query = bind(sql, params);
                let changed = diesel_async::RunQueryDsl::execute(query, &mut *self.0)
                    .await
                    .store()?;
                Ok(changed as u64)
            }

            async fn fetch(
                &mut self,
                sql: &str,
                params: Vec<Param>,
            ) -> Result<Vec<Row>, outbox_core::StoreError> {
                let query = bind(sql, params);
                let rows = diesel_async::RunQueryDsl::load::<AnyRow>(query, &mut *self.0)
                    .await
                    .store()?;
                Ok(rows.into_iter().map(|r| r.0).collect())
            }

            $($extra)*
        }
    };
}
pub(crate) use diesel_exec;
