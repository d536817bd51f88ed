//! `dialect_protocol!`: the `Protocol<D>` of a dialect whose store keeps
//! no state beside its pool and statements (MySQL, SQLite).

/// In a dialect's module with its `Statements` in scope: `Protocol<D>`,
/// the store over driver `D` (its pool, and by `Deref` its statements).
macro_rules! dialect_protocol {
    () => {
        /// The store over driver `D`: its pool, and (by `Deref`) its
        /// [`Statements`].
        #[derive(Clone)]
        pub struct Protocol<D> {
            /// The driver's pool.
            pub driver: D,
            /// The settings and statements.
            pub statements: Statements,
        }

        impl<D> std::ops::Deref for Protocol<D> {
            type Target = Statements;
            fn deref(&self) -> &Statements {
                &self.statements
            }
        }

        impl<D> std::ops::DerefMut for Protocol<D> {
            fn deref_mut(&mut self) -> &mut Statements {
                &mut self.statements
            }
        }
    };
}

/// In a dialect's `impl Statements` (with its `Exec` in scope, its
/// `record_many` taking store time then the entries' JSON): `record`.
macro_rules! record_history {
    () => {
        /// Appends history rows in one statement.
        pub async fn record(
            &self,
            conn: &mut (impl Exec + ?Sized),
            entries: &[$crate::history::HistoryEntry<'_>],
        ) -> Result<(), outbox_core::StoreError> {
            if entries.is_empty() {
                return Ok(());
            }
            let now = self.now(&mut *conn).await?;
            let json = $crate::history::HistoryEntry::batch_json(entries);
            conn.execute(&self.queries.record_many, vec![now.into(), json.into()])
                .await?;
            Ok(())
        }

        /// Records an operator's `kind` of action on `event_id` with
        /// `detail` (its reason when `None`); the event is left with
        /// `attempts`.
        pub async fn record_operator(
            &self,
            conn: &mut (impl Exec + ?Sized),
            event_id: outbox_core::EventId,
            kind: outbox_core::store::AttemptKind,
            detail: Option<&str>,
            action: &outbox_core::store::OperatorAction,
            attempts: i64,
        ) -> Result<(), outbox_core::StoreError> {
            let detail = detail.unwrap_or(&action.reason);
            let entry =
                $crate::history::HistoryEntry::operator(event_id, kind, action, detail, attempts);
            self.record(conn, &[entry]).await
        }
    };
}

/// In a dialect's `impl Statements` (with its `Exec` in scope and an
/// `enqueue_now`): `enqueue`, documented by `$doc`, its errors naming the
/// operation and the events table. With `checked by $json_refuses_nul`,
/// the events are checked here (`enqueue_now` gets a batch of valid
/// events, never an empty one); without, `enqueue_now` checks them.
macro_rules! statements_enqueue {
    ($doc:literal $(, checked by $json_refuses_nul:literal)?) => {
        #[doc = $doc]
        pub async fn enqueue(
            &self,
            conn: &mut (impl Exec + ?Sized),
            events: &[outbox_core::NewEvent],
        ) -> Result<Vec<outbox_core::store::EnqueueOutcome>, outbox_core::StoreError> {
            $crate::error::during("enqueue", || self.events(), async move {
                $(
                    let limits = &self.config.limits;
                    if !$crate::validate::check_events(events, limits, $json_refuses_nul)? {
                        return Ok(Vec::new());
                    }
                )?
                self.enqueue_now(conn, events).await
            })
            .await
        }
    };
}
