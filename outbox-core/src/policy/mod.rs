//! Policies as data: retry/backoff, ordering, poison handling, randomness.

mod ordering;
mod random;
mod retry;

pub use ordering::{Ordering, PoisonPolicy};
pub use random::{FixedRandom, RandomSource, SplitMix64};
pub use retry::{RetryDecision, RetryPolicy};
