//! Which tenants there are: [`TenantId`] and the [`TenantSource`] a fleet
//! re-reads.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;

use crate::error::StoreError;

/// The longest tenant id, in bytes: ids name relays, metric labels and
/// (for schema-per-tenant stores) schemas.
pub const MAX_TENANT_ID_LEN: usize = 128;

/// A tenant's name: non-empty, at most [`MAX_TENANT_ID_LEN`] bytes, no
/// control characters nor whitespace (it goes into relay ids and labels).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TenantId(String);

/// A tenant id that breaks [`TenantId`]'s rules.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid tenant id {id:?}: {reason}")]
pub struct InvalidTenantId {
    /// The id as given.
    pub id: String,
    /// Which rule it breaks.
    pub reason: &'static str,
}

impl TenantId {
    /// `id`, checked.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidTenantId> {
        let id = id.into();
        let reason = if id.is_empty() {
            Some("it is empty")
        } else if id.len() > MAX_TENANT_ID_LEN {
            Some("it is longer than 128 bytes")
        } else if id.chars().any(|c| c.is_control() || c.is_whitespace()) {
            Some("it holds whitespace or a control character")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(InvalidTenantId { id, reason }),
            None => Ok(Self(id)),
        }
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which tenants there are now. Read again every refresh; an error keeps
/// the tenants of the last good read running (and is reported).
#[async_trait]
pub trait TenantSource: Send + Sync {
    /// The tenants to relay.
    async fn tenants(&self) -> Result<BTreeSet<TenantId>, StoreError>;
}

#[async_trait]
impl<T: TenantSource + ?Sized> TenantSource for Box<T> {
    async fn tenants(&self) -> Result<BTreeSet<TenantId>, StoreError> {
        (**self).tenants().await
    }
}

/// A tenant list the application holds and edits (a fixed list from
/// configuration, or one its own admin API changes): clones share it.
#[derive(Clone, Debug, Default)]
pub struct TenantList(Arc<Mutex<BTreeSet<TenantId>>>);

impl TenantList {
    /// A list of `tenants`.
    pub fn new(tenants: impl IntoIterator<Item = TenantId>) -> Self {
        Self(Arc::new(Mutex::new(tenants.into_iter().collect())))
    }

    fn edit<T>(&self, change: impl FnOnce(&mut BTreeSet<TenantId>) -> T) -> T {
        change(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Adds `tenant`; `false` if it was there.
    pub fn add(&self, tenant: TenantId) -> bool {
        self.edit(|set| set.insert(tenant))
    }

    /// Removes `tenant`; `false` if it was not there.
    pub fn remove(&self, tenant: &TenantId) -> bool {
        self.edit(|set| set.remove(tenant))
    }

    /// The tenants now.
    pub fn snapshot(&self) -> BTreeSet<TenantId> {
        self.edit(|set| set.clone())
    }
}

#[async_trait]
impl TenantSource for TenantList {
    async fn tenants(&self) -> Result<BTreeSet<TenantId>, StoreError> {
        Ok(self.snapshot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_cannot_name_a_relay_are_refused() {
        assert!(TenantId::new("acme-eu").is_ok());
        for bad in ["", "two words", "tab\there", "line\n"] {
            let err = TenantId::new(bad).unwrap_err();
            assert_eq!(err.id, bad);
        }
        assert!(TenantId::new("x".repeat(MAX_TENANT_ID_LEN)).is_ok());
        assert_eq!(
            TenantId::new("x".repeat(MAX_TENANT_ID_LEN + 1))
                .unwrap_err()
                .reason,
            "it is longer than 128 bytes"
        );
    }

    #[tokio::test]
    async fn a_list_s_clones_see_its_edits() {
        let list = TenantList::new([TenantId::new("a").unwrap()]);
        let seen_by_fleet = list.clone();
        assert!(list.add(TenantId::new("b").unwrap()));
        assert!(!list.add(TenantId::new("b").unwrap()));
        assert!(list.remove(&TenantId::new("a").unwrap()));
        let now: Vec<_> = seen_by_fleet.tenants().await.unwrap().into_iter().collect();
        assert_eq!(now, [TenantId::new("b").unwrap()]);
    }
}
