//! The replication slot of a `postgresql-cdc` source: what a start does
//! with it ([`plan`]), its confirmed position, dropping it, and the error
//! of a slot the server invalidated.

use std::time::Duration;

use super::SnapshotMode;
use super::pgoutput::parse_lsn;
use crate::ConnectorError;
use crate::sql::replication;

/// The error of a slot the server invalidated (`wal_status` `lost`): the
/// changes it held back are gone, and capturing on from a new slot would
/// skip them silently, so the dataflow stops and says so.
pub(super) fn slot_lost(slot: &str) -> ConnectorError {
    ConnectorError::Config(format!(
        "replication slot {slot} was invalidated by the PostgreSQL server: the WAL it held was removed \
         (max_slot_wal_keep_size), so the changes since the dataflow last confirmed a position are lost. \
         Delete and create the dataflow again to capture from now on, and copy the tables to catch up"
    ))
}

/// What a start does with the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// Stream the slot (made now without a snapshot if missing).
    Stream,
    /// Make the slot with a snapshot, read it, then stream.
    SnapshotThenStream,
    /// Read a snapshot and nothing more (no slot).
    SnapshotOnly,
    /// The snapshot of `initial_only` is written: nothing to read.
    Finished,
}

/// What a start does, by the mode, whether the slot exists, whether the
/// publication says a snapshot is pending (`None`: no publication), and
/// whether the tenant asked for tables to be read again (`requested`).
pub(super) fn plan(mode: SnapshotMode, slot_exists: bool, pending: Option<bool>, requested: bool) -> Plan {
    match mode {
        // A requested snapshot cut by a crash goes on.
        SnapshotMode::Never if requested && slot_exists && pending == Some(true) => Plan::SnapshotThenStream,
        SnapshotMode::Never => Plan::Stream,
        // A pending snapshot, a new dataflow, or a slot lost by hand: the
        // rows since the last confirmed change are read again whole.
        SnapshotMode::Initial if pending == Some(true) || !slot_exists => Plan::SnapshotThenStream,
        SnapshotMode::Initial => Plan::Stream,
        SnapshotMode::InitialOnly if pending == Some(false) => Plan::Finished,
        SnapshotMode::InitialOnly => Plan::SnapshotOnly,
    }
}

/// A slot's confirmed position, if it exists.
pub(super) async fn slot_position(client: &tokio_postgres::Client, slot: &str) -> Result<Option<u64>, ConnectorError> {
    let Some(row) = client
        .query_opt(
            "SELECT confirmed_flush_lsn::text, plugin::text, wal_status = 'lost' \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(ConnectorError::query)?
    else {
        return Ok(None);
    };
    let plugin: Option<String> = row.get(1);
    if plugin.as_deref() != Some("pgoutput") {
        return Err(ConnectorError::Config(format!(
            "replication slot {slot} exists and is not a pgoutput slot"
        )));
    }
    if row.get::<_, Option<bool>>(2) == Some(true) {
        return Err(slot_lost(slot));
    }
    Ok(Some(
        row.get::<_, Option<String>>(0)
            .as_deref()
            .and_then(parse_lsn)
            .unwrap_or(0),
    ))
}

pub(super) async fn drop_slot(client: &tokio_postgres::Client, slot: &str) -> Result<(), ConnectorError> {
    // A run still stopping may hold the slot a moment longer.
    let mut attempts = 0;
    loop {
        match client
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_IN_USE) && attempts < 20 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(ConnectorError::query(e)),
        }
    }
}

/// The LSN of a `CREATE_REPLICATION_SLOT` answer (its consistent point).
pub(super) fn consistent_point(rows: &replication::Rows) -> Result<u64, ConnectorError> {
    rows.rows
        .first()
        .and_then(|row| row.get(1).cloned().flatten())
        .as_deref()
        .and_then(parse_lsn)
        .ok_or_else(|| ConnectorError::Closed("CREATE_REPLICATION_SLOT answered no consistent point".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_snapshot_is_read_again_and_initial_only_finishes_once_written() {
        use SnapshotMode::{Initial, InitialOnly, Never};
        // (mode, slot exists, publication's snapshot pending: None = no
        // publication, tables asked for again)
        let cases = [
            (Initial, false, None, false, Plan::SnapshotThenStream),
            (Initial, true, Some(false), false, Plan::Stream),
            (Initial, true, Some(false), true, Plan::Stream),
            (Initial, true, Some(true), false, Plan::SnapshotThenStream),
            (Initial, false, Some(false), false, Plan::SnapshotThenStream),
            (Never, false, None, false, Plan::Stream),
            (Never, true, Some(true), false, Plan::Stream),
            (Never, true, Some(true), true, Plan::SnapshotThenStream),
            (Never, false, Some(true), true, Plan::Stream),
            (Never, true, Some(false), true, Plan::Stream),
            (InitialOnly, false, None, false, Plan::SnapshotOnly),
            (InitialOnly, false, Some(true), false, Plan::SnapshotOnly),
            (InitialOnly, false, Some(false), false, Plan::Finished),
            (InitialOnly, true, Some(false), false, Plan::Finished),
        ];
        for (mode, slot, pending, requested, want) in cases {
            assert_eq!(
                plan(mode, slot, pending, requested),
                want,
                "{mode:?} {slot} {pending:?} {requested}"
            );
        }
    }
}
