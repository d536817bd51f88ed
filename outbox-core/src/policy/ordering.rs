//! Ordering and poison policies.

/// How strictly a relay orders publication.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Ordering {
    /// Per `partition_key`, publication order equals enqueue order, and no
    /// later event of a key is published while an earlier one is unpublished.
    #[default]
    PerKey,
    /// No ordering promise, for maximum throughput. Chosen explicitly.
    Unordered,
}

/// What a permanently failing ("poison") event does to its key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PoisonPolicy {
    /// Move it to `failed`; the key's later events continue.
    #[default]
    Skip,
    /// Move it to `failed` and park the key (and its backlog, in order)
    /// until an operator requeues, skips or supersedes it.
    Block,
}
