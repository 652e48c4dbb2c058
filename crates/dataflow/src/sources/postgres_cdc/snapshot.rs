//! The initial snapshot of a `postgresql-cdc` source: the tables read in
//! the slot's exported snapshot as `op: r` events, and the mark on the
//! publication that says they are all written.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::pgoutput::{now_ms, snapshot_event, value_of};
use super::reading::{Job, Outbox};
use crate::ConnectorError;
use crate::sources::Position;
use crate::sql::quote;

/// The snapshot's rows are all written: a restart streams on instead of
/// reading them again.
pub(super) struct SnapshotMark {
    pub(super) client: Arc<tokio_postgres::Client>,
    /// The publication, quoted.
    pub(super) publication: String,
    /// Its comment once the snapshot is written.
    pub(super) written: String,
}

impl SnapshotMark {
    pub(super) async fn written(&self) -> Result<(), ConnectorError> {
        self.client
            .batch_execute(&format!(
                "COMMENT ON PUBLICATION {} IS '{}'",
                self.publication, self.written
            ))
            .await
            .map_err(ConnectorError::query)?;
        tracing::info!(publication = %self.publication, "snapshot written");
        Ok(())
    }
}

/// Reads the tables in the snapshot of the open transaction, handing each
/// row out as an `op: r` event; the last one's position completes the
/// snapshot. Whether there was a row.
pub(super) async fn snapshot(job: &mut Job, out: &mut Outbox) -> Result<bool, ConnectorError> {
    let now_ms = now_ms();
    let mut held: Option<Value> = None;
    let mut rows_read = 0u64;
    for (i, table) in job.tables.iter().enumerate() {
        let quoted = quote(table)?;
        // Names as the catalog has them (the table as written may rely
        // on the search path). Quoted names are [A-Za-z0-9_."] only.
        let named = job
            .repl
            .query(&format!(
                "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.oid = '{quoted}'::regclass"
            ))
            .await?;
        let (schema, name) = match named.rows.first().map(|r| r.as_slice()) {
            Some([Some(schema), Some(name)]) => (schema.clone(), name.clone()),
            _ => return Err(ConnectorError::Config(format!("table {table} not found"))),
        };
        let cursor = format!("sless_snapshot_{i}");
        job.repl
            .query(&format!("DECLARE {cursor} NO SCROLL CURSOR FOR SELECT * FROM {quoted}"))
            .await?;
        loop {
            let fetched = job
                .repl
                .query(&format!("FETCH FORWARD {} FROM {cursor}", job.batch))
                .await?;
            if fetched.rows.is_empty() {
                break;
            }
            for row in fetched.rows {
                let mut object = Map::with_capacity(row.len());
                for ((column, oid), value) in fetched.columns.iter().zip(row) {
                    let value = value.map_or(Value::Null, |text| value_of(*oid, &text));
                    object.insert(column.clone(), value);
                }
                let event = snapshot_event(&schema, &name, Value::Object(object), job.start, now_ms);
                if let Some(previous) = held.replace(event) {
                    out.push(previous, Position::SnapshotRow { last: false }).await?;
                }
                rows_read += 1;
            }
        }
        job.repl.query(&format!("CLOSE {cursor}")).await?;
    }
    tracing::info!(slot = %job.slot, rows = rows_read, "snapshot read");
    match held {
        Some(last) => {
            out.push(last, Position::SnapshotRow { last: true }).await?;
            out.flush().await?;
            Ok(true)
        }
        None => Ok(false),
    }
}
