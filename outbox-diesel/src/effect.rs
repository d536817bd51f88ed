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
