//! One LISTEN connection for many stores of one database: the tenants of a
//! fleet share it instead of holding a connection each.

use std::collections::HashMap;
use std::time::Duration;

use outbox_core::StoreError;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{mpsc, oneshot, watch};

use crate::error::ResultExt;

/// What a [`PgListenHub`]'s task is asked to do.
enum Command {
    /// Listen on a channel (if no one does yet) and answer with its counter.
    Listen(
        String,
        oneshot::Sender<Result<watch::Receiver<u64>, StoreError>>,
    ),
    /// One subscriber of a channel is gone; the last one unlistens.
    Release(String),
}

/// One LISTEN connection (taken from the pool, held while any store
/// listens) that serves every store's wake-up on that pool: the tenants of
/// a [`super::PgTenantRelays`] fleet wait on it instead of each holding a
/// connection of its own, so a thousand idle tenants cost one connection
/// and no polling beyond their backstop.
///
/// Each channel's subscribers see a counter that moves on every NOTIFY of
/// their channel, so a notification that arrives between a relay's idle
/// probe and its wait is not lost. When the connection is lost every
/// subscriber is woken once it is back (notifications sent meanwhile are
/// gone; the woken relays look for work themselves).
#[derive(Clone, Debug)]
pub struct PgListenHub {
    commands: mpsc::UnboundedSender<Command>,
}

/// A store's share of a [`PgListenHub`]: its channel's counter.
#[derive(Debug)]
pub(crate) struct HubSubscription {
    channel: String,
    notified: watch::Receiver<u64>,
    commands: mpsc::WeakUnboundedSender<Command>,
}

impl PgListenHub {
    /// A hub on `pool`: its task runs until every clone of the hub is
    /// dropped; the connection is taken at the first subscription.
    pub fn start(pool: PgPool) -> Self {
        let (commands, received) = mpsc::unbounded_channel();
        tokio::spawn(HubTask::new(pool).run(received));
        Self { commands }
    }

    /// Listens on `channel` (once the LISTEN is in force, so no NOTIFY sent
    /// after this returns is missed).
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<HubSubscription, StoreError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || StoreError::Config("the LISTEN hub has stopped".into());
        self.commands
            .send(Command::Listen(channel.to_owned(), reply))
            .map_err(|_| stopped())?;
        let notified = answer.await.map_err(|_| stopped())??;
        Ok(HubSubscription {
            channel: channel.to_owned(),
            notified,
            commands: self.commands.downgrade(),
        })
    }
}

impl HubSubscription {
    /// Resolves at the next NOTIFY of the channel not yet seen (at once if
    /// one came since the last call); never, once the hub has stopped (the
    /// relay's poll is then the only wake-up).
    pub(crate) async fn notified(&mut self) {
        if self.notified.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for HubSubscription {
    fn drop(&mut self) {
        if let Some(commands) = self.commands.upgrade() {
            let _ = commands.send(Command::Release(std::mem::take(&mut self.channel)));
        }
    }
}

/// A channel listened on, and how many subscriptions it has.
struct Channel {
    notified: watch::Sender<u64>,
    subscribers: usize,
}

/// The task that owns the LISTEN connection.
struct HubTask {
    pool: PgPool,
    listener: Option<PgListener>,
    channels: HashMap<String, Channel>,
}

impl HubTask {
    fn new(pool: PgPool) -> Self {
        Self {
            pool,
            listener: None,
            channels: HashMap::new(),
        }
    }

    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            let next = match self.listener.as_mut() {
                Some(listener) if !self.channels.is_empty() => tokio::select! {
                    command = commands.recv() => Some(command),
                    received = listener.try_recv() => {
                        self.received(received).await;
                        None
                    }
                },
                _ => Some(commands.recv().await),
            };
            match next {
                None => {}
                Some(None) => return,
                Some(Some(Command::Listen(channel, reply))) => {
                    let _ = reply.send(self.listen(channel).await);
                }
                Some(Some(Command::Release(channel))) => self.release(&channel).await,
            }
        }
    }

    async fn listen(&mut self, channel: String) -> Result<watch::Receiver<u64>, StoreError> {
        if let Some(known) = self.channels.get_mut(&channel) {
            known.subscribers += 1;
            return Ok(known.notified.subscribe());
        }
        let listener = match self.listener.as_mut() {
            Some(listener) => listener,
            None => self
                .listener
                .insert(PgListener::connect_with(&self.pool).await.store()?),
        };
        if let Err(error) = listener.listen(&channel).await {
            if self.channels.is_empty() {
                // No wait on it notices a dead connection: start afresh next time.
                self.listener = None;
            }
            return Err(error).store();
        }
        let (notified, receiver) = watch::channel(0);
        self.channels.insert(
            channel,
            Channel {
                notified,
                subscribers: 1,
            },
        );
        Ok(receiver)
    }

    async fn release(&mut self, channel: &str) {
        let Some(known) = self.channels.get_mut(channel) else {
            return;
        };
        known.subscribers -= 1;
        if known.subscribers > 0 {
            return;
        }
        self.channels.remove(channel);
        if self.channels.is_empty() {
            // Nothing listens: give the connection back to the pool.
            self.listener = None;
        } else if let Some(listener) = self.listener.as_mut() {
            if let Err(error) = listener.unlisten(channel).await {
                tracing::debug!(%error, channel, "UNLISTEN failed");
            }
        }
    }

    async fn received(
        &mut self,
        received: Result<Option<sqlx::postgres::PgNotification>, sqlx::Error>,
    ) {
        match received {
            Ok(Some(notification)) => {
                if let Some(known) = self.channels.get(notification.channel()) {
                    known.notified.send_modify(|seen| *seen += 1);
                }
            }
            // Reconnected (and listening again); what was sent meanwhile is lost.
            Ok(None) => self.wake_everyone(),
            Err(error) => {
                tracing::warn!(%error, "shared LISTEN connection lost; relays poll until it is back");
                tokio::time::sleep(Duration::from_secs(1)).await;
                let back = match self.listener.as_mut() {
                    Some(listener) => sqlx::query("SELECT 1").execute(listener).await.is_ok(),
                    None => false,
                };
                if back {
                    self.wake_everyone();
                }
            }
        }
    }

    fn wake_everyone(&self) {
        for known in self.channels.values() {
            known.notified.send_modify(|seen| *seen += 1);
        }
    }
}
