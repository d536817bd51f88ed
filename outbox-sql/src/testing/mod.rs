//! The core's fault seams ([`outbox_core::testing::FaultSeams`],
//! [`outbox_core::testing::BeginWrite`]) once per dialect, over any driver
//! (feature `testing`): a write transaction left open, another host's
//! clock, a row another tool wrote, a settlement slow to commit. An
//! adapter's store gets them with [`sql_fault_seams!`](crate::sql_fault_seams).
//! Beside them, [`PrivatePg`](crate::testing::PrivatePg): a PostgreSQL
//! cluster of a test's own.

use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use outbox_core::store::{EnqueueOutcome, Lease, SettleReport};
use outbox_core::testing::OpenWrite;
use outbox_core::{EventId, NewEvent, StoreError};

mod deploys;
mod private_pg;
pub use deploys::{PRODUCER_BESIDE_MIGRATE, three_deploys_beside_a_producer};
pub use private_pg::PrivatePg;

/// What a slow settlement waits for before it commits.
pub type Release = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A dialect's protocol as the fault seams use it.
#[async_trait]
pub trait SeamsProtocol: SlowAck {
    /// Opens a write transaction as business code opens one.
    async fn begin_write(&self) -> Result<Box<dyn OpenWrite>, StoreError>;
    /// Writes, as another tool could, a committed row of key
    /// `partition_key` that decodes into no event (a header that is not a
    /// string); its id.
    async fn write_unreadable_row(&self, partition_key: &str) -> EventId;
    /// Whether two write transactions can be open at once (SQLite: no).
    fn overlapping_writers(&self) -> bool {
        true
    }
}

/// A dialect's settlement held open, as the fault seams use it
/// (`dialect_slow_ack!` writes it for a dialect with overlapping writers).
#[async_trait]
pub trait SlowAck: Send + Sync {
    /// Acks `leases` in a transaction kept open until `release` resolves
    /// (`ready` is sent once the ack's statements ran).
    async fn slow_ack(
        &self,
        leases: &[Lease],
        ready: tokio::sync::oneshot::Sender<()>,
        release: Release,
    ) -> Result<SettleReport, StoreError>;
}

/// An open transaction of a dialect's driver, as [`SqlOpenWrite`] drives it.
#[async_trait]
pub trait WriteTx: Send {
    /// Runs `sql` (no parameters), ignoring its rows.
    async fn run(&mut self, sql: &str) -> Result<(), StoreError>;
    /// Enqueues `event` in the transaction.
    async fn enqueue(&mut self, event: NewEvent) -> Result<EnqueueOutcome, StoreError>;
    /// Commits.
    async fn commit(self) -> Result<(), StoreError>;
}

/// A write transaction left open for a test: what a business write and a
/// read of the outbox tables are in this dialect.
pub struct SqlOpenWrite<T> {
    /// The open transaction.
    pub tx: T,
    /// A business write that gives the transaction its id.
    pub business_write: String,
    /// A read of the events table (fixes a REPEATABLE READ snapshot).
    pub read: String,
}

impl<T: WriteTx + 'static> SqlOpenWrite<T> {
    /// `tx` left open for a test, with the events table `events` to read.
    pub fn boxed(tx: T, business_write: &str, events: &str) -> Box<dyn OpenWrite> {
        Box::new(Self {
            tx,
            business_write: business_write.to_owned(),
            read: format!("SELECT COUNT(*) AS n FROM {events}"),
        })
    }
}

#[async_trait]
impl<T: WriteTx> OpenWrite for SqlOpenWrite<T> {
    async fn write_business_row(&mut self) -> Result<(), StoreError> {
        self.tx.run(&self.business_write).await
    }
    async fn read(&mut self) -> Result<(), StoreError> {
        self.tx.run(&self.read).await
    }
    async fn enqueue(&mut self, event: NewEvent) -> Result<EnqueueOutcome, StoreError> {
        self.tx.enqueue(event).await
    }
    async fn commit(self: Box<Self>) -> Result<(), StoreError> {
        self.tx.commit().await
    }
}

/// In a dialect's `testing` module (with its `Driver`, `Exec` and
/// `Protocol` in scope): `Write<D>`, a transaction of driver `D` with the
/// protocol that enqueues into it.
macro_rules! dialect_write {
    () => {
        struct Write<D: Driver> {
            protocol: Protocol<D>,
            tx: D::Tx,
        }

        /// `tx` left open for a test, with `business_write` as its
        /// business write.
        fn open_write<D: Driver>(
            protocol: &Protocol<D>,
            tx: D::Tx,
            business_write: &str,
        ) -> Box<dyn outbox_core::testing::OpenWrite> {
            let events = protocol.config.tables.events();
            let protocol = protocol.clone();
            $crate::testing::SqlOpenWrite::boxed(Write { protocol, tx }, business_write, &events)
        }

        #[async_trait::async_trait]
        impl<D: Driver> $crate::testing::WriteTx for Write<D> {
            async fn run(&mut self, sql: &str) -> Result<(), outbox_core::StoreError> {
                self.tx.fetch(sql, Vec::new()).await.map(drop)
            }
            async fn enqueue(
                &mut self,
                event: outbox_core::NewEvent,
            ) -> Result<outbox_core::store::EnqueueOutcome, outbox_core::StoreError> {
                Ok(self.protocol.enqueue(&mut self.tx, &[event]).await?[0])
            }
            async fn commit(self) -> Result<(), outbox_core::StoreError> {
                D::commit(self.tx).await
            }
        }
    };
}

/// Beside [`dialect_write!`]: [`SlowAck`] on `Protocol<D>`, an ack whose
/// transaction stays open until released; `$begin` opens the relay's
/// transaction on `$protocol`.
macro_rules! dialect_slow_ack {
    (|$protocol:ident| $begin:expr) => {
        #[async_trait::async_trait]
        impl<D: Driver> $crate::testing::SlowAck for Protocol<D> {
            async fn slow_ack(
                &self,
                leases: &[outbox_core::store::Lease],
                ready: tokio::sync::oneshot::Sender<()>,
                release: $crate::testing::Release,
            ) -> Result<outbox_core::store::SettleReport, outbox_core::StoreError> {
                let $protocol = self;
                let mut tx = $begin.await?;
                let report = $protocol.ack_in(&mut tx, leases).await?;
                let _ = ready.send(());
                release.await;
                D::commit(tx).await?;
                Ok(report)
            }
        }
    };
}

/// Implements the core's `BeginWrite` and `FaultSeams` for `$store` over
/// its protocol field `$field` (a [`SeamsProtocol`]); another host's clock
/// is a clone whose settings carry it, and `$rebuild` (optional) brings
/// the rest of the handle to those settings.
#[macro_export]
macro_rules! sql_fault_seams {
    ($store:ty, $field:ident $(, |$handle:ident| $rebuild:expr)?) => {
        #[$crate::__private::async_trait]
        impl $crate::__private::testing::BeginWrite for $store {
            async fn begin_write(
                &self,
            ) -> Result<Box<dyn $crate::__private::testing::OpenWrite>, $crate::__private::StoreError>
            {
                $crate::testing::SeamsProtocol::begin_write(&self.$field).await
            }
        }

        #[$crate::__private::async_trait]
        impl $crate::__private::testing::FaultSeams for $store {
            fn with_host_clock(
                &self,
                host_clock: std::sync::Arc<dyn $crate::__private::Clock>,
            ) -> std::sync::Arc<Self> {
                let mut handle = self.clone();
                let config = handle.$field.statements.config.clone();
                handle.$field.statements.config = config.with_clock(host_clock);
                $(let $handle = &mut handle; $rebuild;)?
                std::sync::Arc::new(handle)
            }
            async fn write_unreadable_row(&self, partition_key: &str) -> $crate::__private::EventId {
                $crate::testing::SeamsProtocol::write_unreadable_row(&self.$field, partition_key).await
            }
            async fn slow_ack(
                &self,
                leases: &[$crate::__private::store::Lease],
                ready: $crate::__private::oneshot::Sender<()>,
                release: $crate::testing::Release,
            ) -> Result<$crate::__private::store::SettleReport, $crate::__private::StoreError> {
                $crate::testing::SlowAck::slow_ack(&self.$field, leases, ready, release).await
            }
            fn overlapping_writers(&self) -> bool {
                $crate::testing::SeamsProtocol::overlapping_writers(&self.$field)
            }
        }
    };
}
