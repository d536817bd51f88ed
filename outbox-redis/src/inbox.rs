//! [`RedisInbox`]: an inbox for effects that live in Redis itself.
//!
//! Claims and effects are queued in a [`RedisInboxTx`] and applied at commit
//! by one Lua script: if none of the claim keys exists, it sets them (with a
//! TTL equal to the dedup window) and runs the effect commands; otherwise it
//! applies nothing and the commit reports a conflict (already applied).
//!
//! **When it is safe.** The effect must be Redis commands on the same server
//! (the script makes claim and effect atomic). It is *not* safe for effects
//! elsewhere (a database, an API): use the SQL inbox there. The dedup window
//! is the TTL: a redelivery after it expires is applied again. Redis without
//! persistence (AOF) forgets claims on restart, and a script that fails half
//! way is not rolled back (Redis has no rollback), so keep effect commands
//! simple and valid. For money movement, prefer the SQL inbox.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{EventId, InboxStore, StoreError};
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};

const CLAIM_AND_APPLY: &str = r"
for _, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.call('SET', key, '1', 'EX', ARGV[1])
end
local pos = 3
for _ = 1, tonumber(ARGV[2]) do
  local argc = tonumber(ARGV[pos]); pos = pos + 1
  local args = {}
  for a = 1, argc do args[a] = ARGV[pos]; pos = pos + 1 end
  redis.call(unpack(args))
end
return 1
";

/// The Redis inbox. Claim keys are `{prefix}{consumer}:{event_id}`.
#[derive(Clone)]
pub struct RedisInbox {
    connection: ConnectionManager,
    prefix: String,
    dedup_window: Duration,
    script: Script,
}

impl std::fmt::Debug for RedisInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisInbox")
            .field("prefix", &self.prefix)
            .field("dedup_window", &self.dedup_window)
            .finish_non_exhaustive()
    }
}

impl RedisInbox {
    /// An inbox whose claims live `dedup_window` (longer than the longest
    /// redelivery or replay window you expect).
    pub fn new(
        connection: ConnectionManager,
        prefix: impl Into<String>,
        dedup_window: Duration,
    ) -> Self {
        Self {
            connection,
            prefix: prefix.into(),
            dedup_window,
            script: Script::new(CLAIM_AND_APPLY),
        }
    }

    fn key(&self, consumer: &str, event_id: EventId) -> String {
        format!("{}{consumer}:{event_id}", self.prefix)
    }
}

/// Claims and effect commands, applied together at commit.
#[derive(Debug, Default)]
pub struct RedisInboxTx {
    claims: Vec<String>,
    effects: Vec<Vec<Vec<u8>>>,
}

impl RedisInboxTx {
    /// Queues an effect command (name and arguments), run only if the claims succeed.
    pub fn effect<I, A>(&mut self, command: I)
    where
        I: IntoIterator<Item = A>,
        A: AsRef<[u8]>,
    {
        self.effects
            .push(command.into_iter().map(|a| a.as_ref().to_vec()).collect());
    }
}

#[async_trait]
impl InboxStore for RedisInbox {
    type Transaction = RedisInboxTx;

    async fn begin(&self) -> Result<RedisInboxTx, StoreError> {
        Ok(RedisInboxTx::default())
    }

    async fn claim(
        &self,
        tx: &mut RedisInboxTx,
        consumer: &str,
        event_id: EventId,
    ) -> Result<bool, StoreError> {
        let key = self.key(consumer, event_id);
        if tx.claims.contains(&key) {
            return Ok(false);
        }
        let exists: bool = self
            .connection
            .clone()
            .exists(&key)
            .await
            .map_err(StoreError::retryable)?;
        if exists {
            return Ok(false);
        }
        tx.claims.push(key);
        Ok(true)
    }

    async fn commit(&self, tx: RedisInboxTx) -> Result<(), StoreError> {
        let mut invocation = self.script.prepare_invoke();
        for key in &tx.claims {
            invocation.key(key);
        }
        invocation.arg(self.dedup_window.as_secs().max(1));
        invocation.arg(tx.effects.len());
        for command in &tx.effects {
            invocation.arg(command.len());
            for arg in command {
                invocation.arg(arg.as_slice());
            }
        }
        let applied: i64 = invocation
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(StoreError::retryable)?;
        if applied == 1 {
            Ok(())
        } else {
            Err(StoreError::Conflict(
                "an inbox claim was committed concurrently; nothing applied".into(),
            ))
        }
    }

    async fn rollback(&self, _tx: RedisInboxTx) -> Result<(), StoreError> {
        Ok(())
    }

    /// Claims expire by TTL (the dedup window); nothing to delete.
    async fn purge_older_than(
        &self,
        _older_than: Duration,
        _batch_size: usize,
    ) -> Result<u64, StoreError> {
        Ok(0)
    }
}
