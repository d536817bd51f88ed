//! The relay state machine.

mod alert;
mod batch;
mod config;
mod health;
pub mod metrics;
mod pace;
mod prefetch;
mod report;
mod runner;
mod wake_up;

/// The relay's name in leases, heartbeats and metrics ([`RelayConfig::relay_id`]).
pub use crate::store::RelayId;
pub use alert::{AlertHook, FailedAlert, FailureCause, LogAlert};
pub use config::{ConfigError, OutagePolicy, RelayConfig};
pub use health::{OngoingOutage, RelayHealth};
pub use pace::{BatchDone, FullSpeed, Pace};
pub use report::{RelayError, RelayReport};
pub use runner::Relay;
pub use wake_up::{PollOnly, WakeUp};
