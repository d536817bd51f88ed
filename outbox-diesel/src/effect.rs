//! [`Effect`]: the closure `apply_once` takes.

/// An async closure over a connection whose future can be named (and so
/// required to be `Send`); every `async |conn| { … }` is one. The same
/// device diesel-async's `transaction` uses.
pub trait Effect<T, R>: AsyncFnOnce(T) -> R + FnOnce(T) -> <Self as Effect<T, R>>::Fut {
    /// The closure's future.
    type Fut: std::future::Future<Output = R>;
}

impl<F, T, Fut, R> Effect<T, R> for F
where
    F: AsyncFnOnce(T) -> R + FnOnce(T) -> Fut,
    Fut: std::future::Future<Output = R>,
{
    type Fut = Fut;
}

/// A synchronous delivery: in one Diesel transaction on `conn`, `claim`
/// writes the inbox claim and, if it is new, `effect` runs on the same
/// connection; both commit or neither does. `Ok(None)` is a redelivery
/// (nothing ran); an error from `effect` rolls the claim back, so a later
/// delivery tries again. Every dialect's `apply_once_sync`.
pub(crate) fn claim_then_apply<C, R, E>(
    conn: &mut C,
    claim: impl FnOnce(&mut C) -> Result<bool, outbox_core::StoreError>,
    effect: impl FnOnce(&mut C) -> Result<R, E>,
) -> Result<Option<R>, E>
where
    C: diesel::Connection,
    E: From<diesel::result::Error> + From<outbox_core::StoreError>,
{
    conn.transaction::<_, E, _>(|conn| {
        if !claim(conn)? {
            return Ok(None);
        }
        Ok(Some(effect(conn)?))
    })
}
