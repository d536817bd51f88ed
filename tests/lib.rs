//! Tests that span adapters (no library code): an event enqueued through
//! Diesel and published by the sqlx store's relay (and the other way
//! round, on MariaDB), inbox claims shared by
//! both ORMs, and the catalog Diesel's migration builds against the one
//! the sqlx store's `migrate` builds. Each adapter's own tests stay in its
//! crate; adapters never depend on each other, this crate depends on them
//! all. PostgreSQL and MariaDB both.

use outbox_core::{EventId, InboxStore};

/// Two catalogs (sorted entries) are the same; on a difference, the
/// entries only one side has. Prints how many were compared.
pub fn assert_same_catalog(diesel_catalog: &[String], sqlx_catalog: &[String]) {
    assert!(diesel_catalog.len() > 50, "{diesel_catalog:#?}");
    let only_diesel: Vec<_> = diesel_catalog
        .iter()
        .filter(|e| !sqlx_catalog.contains(e))
        .collect();
    let only_sqlx: Vec<_> = sqlx_catalog
        .iter()
        .filter(|e| !diesel_catalog.contains(e))
        .collect();
    assert!(
        only_diesel.is_empty() && only_sqlx.is_empty(),
        "catalogs differ:\nonly through Diesel: {only_diesel:#?}\nonly through sqlx: {only_sqlx:#?}"
    );
    assert_eq!(diesel_catalog, sqlx_catalog);
    println!("the same {} catalog entries", diesel_catalog.len());
}

/// Inbox claims are one table: a claim committed through `diesel` is a
/// duplicate to `sqlx`, and the other way round.
pub async fn assert_inbox_claims_are_shared<D: InboxStore, S: InboxStore>(diesel: &D, sqlx: &S) {
    let (first, second) = (EventId::random(), EventId::random());
    let mut tx = diesel.begin().await.unwrap();
    assert!(diesel.claim(&mut tx, "billing", first).await.unwrap());
    diesel.commit(tx).await.unwrap();
    let mut tx = sqlx.begin().await.unwrap();
    assert!(!sqlx.claim(&mut tx, "billing", first).await.unwrap());
    assert!(sqlx.claim(&mut tx, "billing", second).await.unwrap());
    sqlx.commit(tx).await.unwrap();
    let mut tx = diesel.begin().await.unwrap();
    assert!(!diesel.claim(&mut tx, "billing", second).await.unwrap());
    diesel.rollback(tx).await.unwrap();
}
