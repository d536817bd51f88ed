//! Wake-up hints that end an idle relay's wait early.

use async_trait::async_trait;

/// A source of "new events were committed" hints (Postgres LISTEN/NOTIFY, an
/// in-process channel). A hint only shortens the wait: polling stays the
/// backstop, so a lost hint costs at most one poll interval.
#[async_trait]
pub trait WakeUp: Send + Sync {
    /// Resolves at the next hint (or never, if the source has none).
    async fn wait(&mut self);
}

/// No hints: the relay relies on polling alone.
#[derive(Debug, Default, Clone, Copy)]
pub struct PollOnly;

#[async_trait]
impl WakeUp for PollOnly {
    async fn wait(&mut self) {
        std::future::pending::<()>().await;
    }
}

#[async_trait]
impl<W: WakeUp + ?Sized> WakeUp for Box<W> {
    async fn wait(&mut self) {
        (**self).wait().await;
    }
}
