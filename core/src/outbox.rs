//! The durable outbox of plugin events (`turn-failed`, `turn-succeeded`).
//!
//! Events are appended in the transaction that records a turn's outcome, so an outcome
//! never exists without its event. Each subscriber (a plugin role exporting `turn-events`,
//! e.g. `provider-retry`) has its own delivery state: an event stays pending for it until
//! the host [`Core::ack`]s it, which the host does only after the plugin's call returned.
//! A trap, a timeout or a restart leaves the event pending, so it is delivered again: at
//! least once, in order per thread.
//!
//! Host loop, per subscriber:
//!
//! ```text
//! for ev in core.pending_events(sub, n):        // ordered by event id
//!     skip ev if an earlier event of ev's thread failed in this pass (keeps thread order)
//!     call the plugin ──► returned Ok / invalid-input   ─► core.ack(sub, ev.id)
//!                     └─► trapped / storage / dependency ─► core.note_delivery_failure(..)
//! ```

use rusqlite::{OptionalExtension, Transaction, params};

use crate::error::CoreError;
use crate::model::*;
use crate::store::{CachedSql, Core};

pub(crate) fn append(
    tx: &Transaction<'_>,
    request: &str,
    event: &PluginEvent,
    now: Timestamp,
) -> Result<EventId, CoreError> {
    let payload = serde_json::to_string(event).map_err(|e| CoreError::Storage(e.to_string()))?;
    tx.exec(
        "INSERT INTO outbox (thread_id, request_id, kind, payload, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![event.thread(), request, event.kind(), payload, now],
    )?;
    Ok(tx.last_insert_rowid() as EventId)
}

impl Core {
    /// Registers a subscriber (idempotent). A new subscriber receives the events written
    /// from now on; a known one keeps its delivery state, so a swapped implementation of
    /// the same role continues where the previous one stopped.
    pub fn register_subscriber(&self, name: &str) -> Result<(), CoreError> {
        if name.trim().is_empty() {
            return Err(CoreError::InvalidArgument(
                "a subscriber needs a name".into(),
            ));
        }
        let now = self.now();
        self.write(|tx| {
            tx.exec(
                "INSERT INTO outbox_subscribers (name, first_event, registered_at)
                 VALUES (?1, (SELECT COALESCE(MAX(id), 0) + 1 FROM outbox), ?2)
                 ON CONFLICT (name) DO NOTHING",
                params![name, now],
            )?;
            Ok(())
        })
    }

    /// Up to `limit` events not yet acknowledged by `subscriber`, in the order they were
    /// written (hence in order per thread).
    pub fn pending_events(
        &self,
        subscriber: &str,
        limit: usize,
    ) -> Result<Vec<OutboxEvent>, CoreError> {
        self.read(|c| {
            let first: Option<i64> = c
                .row(
                    "SELECT first_event FROM outbox_subscribers WHERE name = ?1",
                    [subscriber],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(first) = first else {
                return Err(CoreError::InvalidArgument(format!(
                    "unknown subscriber {subscriber}"
                )));
            };
            let mut stmt = c.prepare_cached(
                "SELECT o.id, o.created_at, COALESCE(d.failed_attempts, 0), o.payload
                 FROM outbox o
                 LEFT JOIN outbox_deliveries d ON d.event_id = o.id AND d.subscriber = ?1
                 WHERE o.id >= ?2 AND d.done_at IS NULL
                 ORDER BY o.id LIMIT ?3",
            )?;
            let rows = stmt.query_map(params![subscriber, first, limit as i64], |r| {
                Ok((
                    r.get::<_, EventId>(0)?,
                    r.get::<_, Timestamp>(1)?,
                    r.get::<_, u32>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (id, created_at, failed_deliveries, payload) = row?;
                let event = serde_json::from_str(&payload)
                    .map_err(|e| CoreError::Storage(format!("outbox event {id}: {e}")))?;
                out.push(OutboxEvent {
                    id,
                    created_at,
                    failed_deliveries,
                    event,
                });
            }
            Ok(out)
        })
    }

    /// Marks `event` delivered to `subscriber`: the plugin's call returned (or answered
    /// `invalid-input`, which is final). Idempotent.
    pub fn ack(&self, subscriber: &str, event: EventId) -> Result<(), CoreError> {
        let now = self.now();
        self.write(|tx| {
            ensure_subscriber(tx, subscriber)?;
            ensure_event(tx, event)?;
            tx.exec(
                "INSERT INTO outbox_deliveries (subscriber, event_id, done_at)
                 VALUES (?1, ?2, ?3)
                 ON CONFLICT (subscriber, event_id) DO UPDATE
                    SET done_at = COALESCE(done_at, excluded.done_at)",
                params![subscriber, event, now],
            )?;
            Ok(())
        })
    }

    /// Records a failed delivery (trap, timeout, transient plugin error). The event stays
    /// pending and is delivered again.
    pub fn note_delivery_failure(
        &self,
        subscriber: &str,
        event: EventId,
        error: &str,
    ) -> Result<(), CoreError> {
        self.write(|tx| {
            ensure_subscriber(tx, subscriber)?;
            ensure_event(tx, event)?;
            tx.exec(
                "INSERT INTO outbox_deliveries (subscriber, event_id, failed_attempts, last_error)
                 VALUES (?1, ?2, 1, ?3)
                 ON CONFLICT (subscriber, event_id) DO UPDATE
                    SET failed_attempts = failed_attempts + 1, last_error = excluded.last_error",
                params![subscriber, event, error],
            )?;
            Ok(())
        })
    }
}

fn ensure_subscriber(tx: &Transaction<'_>, subscriber: &str) -> Result<(), CoreError> {
    let exists: bool = tx.row(
        "SELECT EXISTS (SELECT 1 FROM outbox_subscribers WHERE name = ?1)",
        [subscriber],
        |r| r.get(0),
    )?;
    if exists {
        Ok(())
    } else {
        Err(CoreError::InvalidArgument(format!(
            "unknown subscriber {subscriber}"
        )))
    }
}

fn ensure_event(tx: &Transaction<'_>, event: EventId) -> Result<(), CoreError> {
    let exists: bool = tx.row(
        "SELECT EXISTS (SELECT 1 FROM outbox WHERE id = ?1)",
        [event],
        |r| r.get(0),
    )?;
    if exists {
        Ok(())
    } else {
        Err(CoreError::InvalidArgument(format!(
            "no outbox event {event}"
        )))
    }
}
