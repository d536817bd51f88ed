//! In-memory store, inbox and publishers with the same semantics as the
//! real backends, for users' unit tests and the core's own.

mod admin;
mod inbox;
mod mock;
mod recording;
mod state;
mod store;

pub use inbox::{MemoryInbox, MemoryInboxTx};
pub use mock::{MockHandle, MockPublisher, PendingPublish};
pub use recording::{Fault, RecordingPublisher};
pub use store::{MemoryStore, MemoryWakeUp, MemoryWriteTx};
