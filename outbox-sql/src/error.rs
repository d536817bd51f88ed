//! Naming the operation and table in a store error.

use outbox_core::StoreError;

/// Runs one store operation, naming it and its table in a driver error
/// (see [`StoreError::during`]). The table's name is formatted only when
/// the operation fails: every claim, ack and enqueue runs through here.
pub async fn during<T>(
    operation: &'static str,
    target: impl FnOnce() -> String,
    work: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    work.await
        .map_err(|error| error.during(operation, target()))
}
