//! The run's own servers: a private PostgreSQL cluster and a private
//! `redis-server` with AOF, the same helpers the stores' and the Redis
//! adapter's server tests use.

pub(crate) use outbox_redis::testing::PrivateRedis;
pub(crate) use outbox_sql::testing::PrivatePg;
