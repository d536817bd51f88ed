//! [`consumer_error!`](crate::consumer_error): a broker's `ConsumerError`,
//! declared alike by every consumer runner.

/// Declares `ConsumerError` in a broker crate: why its consumer stopped.
/// The broker's own variant (`$variant($inner)`, shown as `$display`) sits
/// beside the two every runner has: the inbox's store failing with a
/// non-retryable error (`Inbox`, converted from a
/// [`StoreError`](crate::StoreError) by `?`) and a setting that cannot work
/// (`Config`). The crate needs `thiserror` among its dependencies.
#[macro_export]
macro_rules! consumer_error {
    ($(#[$doc:meta])* $variant:ident($inner:ty), $display:literal) => {
        /// Why a consumer stopped.
        #[derive(Debug, thiserror::Error)]
        pub enum ConsumerError {
            $(#[$doc])*
            #[error($display)]
            $variant($inner),
            /// The inbox's store failed with a non-retryable error.
            #[error("inbox: {0}")]
            Inbox($crate::StoreError),
            /// A setting that cannot work.
            #[error("invalid consumer configuration: {0}")]
            Config(String),
        }

        // By hand, not `#[from]`: that would also make the inner error this
        // error's `source` and repeat it in reports.
        impl From<$crate::StoreError> for ConsumerError {
            fn from(error: $crate::StoreError) -> Self {
                Self::Inbox(error)
            }
        }
    };
}
