//! PostgreSQL (feature `postgres`).

mod admin;
mod inbox;
mod kept;
mod listen;
use outbox_sql::postgres as queries;
mod row;
mod store;
#[cfg(feature = "testing")]
mod testing;

pub use inbox::PgInbox;
pub use listen::PgWakeUp;
pub use store::PgStore;
#[cfg(feature = "testing")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "testing")))]
pub use testing::{EffectLog, EndToEndDb};
