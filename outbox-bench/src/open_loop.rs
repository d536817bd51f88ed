//! An open-loop producer: one commit started every `1/rate` seconds, on
//! schedule whatever earlier commits take. A closed loop (the next commit
//! after the last) slows down with the system under test and hides the
//! latency it is meant to show.

use std::future::Future;
use std::time::Duration;

use crate::env::Error;

/// Starts `commit(i)` for `i` in `0..total` at `rate` a second, each on a
/// task of its own, and waits for all of them.
pub async fn open_loop<F, Fut>(rate: u64, total: u64, mut commit: F) -> Result<(), Error>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<(), Error>> + Send + 'static,
{
    let start = tokio::time::Instant::now();
    let mut producers = Vec::with_capacity(total as usize);
    for i in 0..total {
        tokio::time::sleep_until(start + Duration::from_micros(i * 1_000_000 / rate)).await;
        producers.push(tokio::spawn(commit(i)));
    }
    for producer in producers {
        producer.await??;
    }
    Ok(())
}
