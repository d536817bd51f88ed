//! The relay state machine.

mod alert;
mod batch;
mod config;
pub mod metrics;
mod prefetch;
mod report;
mod runner;
mod wake_up;

pub use alert::{AlertHook, FailedAlert, FailureCause, LogAlert};
pub use config::{ConfigError, OutagePolicy, RelayConfig};
pub use report::{RelayError, RelayReport};
pub use runner::Relay;
pub use wake_up::{PollOnly, WakeUp};
