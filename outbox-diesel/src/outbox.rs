//! `diesel_outbox!`: the enqueue side of a dialect (what a Diesel
//! application writes with), over that dialect's `outbox_sql` statements.

/// Declares `$name`, the outbox tables as a Diesel application writes them
/// on `$conn`: its settings and its enqueue over `$statements` (built once
/// per store; clones share them behind an `Arc`). Each dialect adds its
/// schema text and its migrate beside it.
macro_rules! diesel_outbox {
    (
        $(#[$doc:meta])* $name:ident($conn:ty, $statements:ty);
        $(#[$enqueue_doc:meta])* enqueue
    ) => {
        $(#[$doc])*
        #[derive(Clone)]
        pub struct $name {
            statements: $statements,
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("tables", &self.statements.config.tables)
                    .finish_non_exhaustive()
            }
        }

        impl $name {
            /// The outbox on `config`'s tables (names were validated when built).
            pub fn new(config: outbox_sql::StoreConfig) -> Self {
                Self {
                    statements: <$statements>::new(config),
                }
            }

            /// The settings.
            pub fn config(&self) -> &outbox_sql::StoreConfig {
                &self.statements.config
            }

            $(#[$enqueue_doc])*
            pub async fn enqueue(
                &self,
                conn: &mut $conn,
                events: &[outbox_core::NewEvent],
            ) -> Result<Vec<outbox_core::store::EnqueueOutcome>, outbox_core::StoreError> {
                self.statements.enqueue(&mut driver::Diesel(conn), events).await
            }
        }
    };
}
