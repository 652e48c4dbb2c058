//! What the polling sources (PostgreSQL, ClickHouse) share: the read
//! position, which is the incremental column's value of the last row read
//! and, when that column is not unique (a change time), the `idColumn`'s
//! value of the same row, so rows sharing a change time are never split and
//! skipped at a batch boundary; and the loop that polls after it and saves
//! it as the checkpoint once rows are written.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Position, Record};
use crate::checkpoint::CheckpointStore;
use crate::context::PipelineContext;
use crate::{ConnectorError, store_error};
use sless_runtime::sync::Unpoisoned;

pub const DEFAULT_POLL: Duration = Duration::from_secs(5);

/// What begins an exactly-once sink's text of a row position.
const RESUME_PREFIX: &str = "row:";

/// An exactly-once sink's text of the position of the last of `done`.
pub fn resume_text(done: &[Position]) -> Option<String> {
    match done.last() {
        Some(Position::Column(last)) => Some(format!("{RESUME_PREFIX}{last}")),
        _ => None,
    }
}

/// Where reading goes on: after this row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RowPosition {
    pub value: String,
    /// The id of the row, when the incremental column is not the id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

impl RowPosition {
    /// A checkpoint as saved: the plain value where the incremental column
    /// is unique (and in checkpoints of before ids were kept), else JSON.
    pub fn parse(text: &str) -> Self {
        serde_json::from_str(text).unwrap_or_else(|_| Self {
            value: text.to_owned(),
            id: None,
        })
    }

    /// The position of `row`, a JSON object: its `column`'s value, and its
    /// `id` column's where the position has one (a JSON string as it is,
    /// any other value as JSON).
    pub fn of(row: &serde_json::Value, column: &str, id: Option<&str>) -> Self {
        let text = |name: &str| match &row[name] {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        };
        Self {
            value: text(column).unwrap_or_default(),
            id: id.and_then(text),
        }
    }

    /// The record of a row read at this position, with the position.
    pub fn record(self, data: serde_json::Value) -> (Record, Self) {
        let record = Record {
            message: crate::message::Message::new(data),
            position: Position::Column(self.text()),
        };
        (record, self)
    }

    pub fn text(&self) -> String {
        match self.id {
            None => self.value.clone(),
            // A struct of strings serialises infallibly.
            Some(_) => serde_json::to_string(self).unwrap_or_default(),
        }
    }
}

/// The read position of a polling source and its checkpoint.
pub(crate) struct Polling {
    poll_interval: Duration,
    /// The position of the last row read.
    read_position: Mutex<Option<RowPosition>>,
    checkpoint: Option<Arc<dyn CheckpointStore>>,
}

impl Polling {
    /// Starts from where an exactly-once sink says the rows are written
    /// (never behind the checkpoint, which is saved only after the sinks
    /// wrote), else from the saved checkpoint, if any; `poll_interval` in
    /// seconds, default [`DEFAULT_POLL`].
    pub async fn start(poll_interval: Option<u32>, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let checkpoint = ctx.checkpoint.clone();
        let start = match (&ctx.resume, &checkpoint) {
            (Some(text), _) => Some(RowPosition::parse(text.strip_prefix(RESUME_PREFIX).ok_or_else(
                || ConnectorError::Config(format!("the sink's stored position {text:?} is not a row position")),
            )?)),
            (None, Some(store)) => store.load().await.map_err(store_error)?.map(|t| RowPosition::parse(&t)),
            (None, None) => None,
        };
        Ok(Self {
            poll_interval: poll_interval.map_or(DEFAULT_POLL, |s| Duration::from_secs(u64::from(s.max(1)))),
            read_position: Mutex::new(start),
            checkpoint,
        })
    }

    /// The rows `fetch` finds after the read position, polling until there
    /// are some; the read position moves past them.
    pub async fn read<F, Fut>(&self, fetch: F) -> Result<Vec<Record>, ConnectorError>
    where
        F: Fn(Option<RowPosition>) -> Fut,
        Fut: Future<Output = Result<Vec<(Record, RowPosition)>, ConnectorError>>,
    {
        loop {
            let after = self.read_position.lock_unpoisoned().clone();
            let rows = fetch(after).await?;
            if let Some((_, last)) = rows.last() {
                *self.read_position.lock_unpoisoned() = Some(last.clone());
                return Ok(rows.into_iter().map(|(record, _)| record).collect());
            }
            tokio::time::sleep(self.poll_interval).await;
        }
    }

    /// Saves the position of the last of `done` as the checkpoint.
    pub async fn commit(&self, done: &[Position]) -> Result<(), ConnectorError> {
        let (Some(store), Some(Position::Column(last))) = (&self.checkpoint, done.last()) else {
            return Ok(());
        };
        store.save(last).await.map_err(store_error)
    }
}

#[cfg(test)]
mod tests {
    use super::RowPosition;

    #[test]
    fn positions_round_trip_and_old_checkpoints_still_load() {
        for position in [
            RowPosition {
                value: "42".into(),
                id: None,
            },
            RowPosition {
                value: "2026-01-01 00:00:03+00".into(),
                id: Some("7".into()),
            },
        ] {
            assert_eq!(RowPosition::parse(&position.text()), position);
        }
        assert_eq!(RowPosition::parse("42").text(), "42");
    }
}
