//! PostgreSQL source: polls a table (or a query) for rows whose incremental
//! column (an id or a change time) is past the read position, in order, a
//! batch at a time. The position of the last written row is the checkpoint.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::{DEFAULT_BATCH, Position, Record, Source};
use crate::dataflow::checkpoint::CheckpointStore;
use crate::dataflow::message::Message;
use crate::dataflow::pipeline::PipelineContext;
use crate::dataflow::sql::{connect, quote};
use crate::dataflow::{ConnectorError, store_error};
use crate::model::connector_config::PostgresSourceConfig;

pub const DEFAULT_POLL: Duration = Duration::from_secs(5);

pub struct PostgresSource {
    client: tokio_postgres::Client,
    select: String,
    batch: usize,
    poll_interval: Duration,
    /// The incremental column of the last row read.
    read_position: Mutex<Option<String>>,
    checkpoint: Option<Arc<dyn CheckpointStore>>,
}

impl PostgresSource {
    pub async fn connect(config: &PostgresSourceConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let dsn = config
            .connection_string
            .as_deref()
            .ok_or_else(|| ConnectorError::Config("connectionString is required".into()))?;
        let column_name = config.incremental_column.clone().unwrap_or_else(|| "id".into());
        let column = quote(&column_name)?;
        let from = match (&config.query, &config.table) {
            (Some(query), _) => format!("({query})"),
            (None, Some(table)) => quote(table)?,
            (None, None) => return Err(ConnectorError::Config("table or query is required".into())),
        };
        let client = connect(dsn).await?;
        // The column's type, so positions compare as that type, not as text.
        let probe = client
            .prepare(&format!("SELECT * FROM {from} AS q LIMIT 0"))
            .await
            .map_err(ConnectorError::query)?;
        let Some(col) = probe.columns().iter().find(|c| c.name() == column_name) else {
            return Err(ConnectorError::Config(format!(
                "the source has no column {column_name:?} to read incrementally"
            )));
        };
        let ty = col.type_().name().to_owned();
        let batch = config.batch_size.unwrap_or(DEFAULT_BATCH as u32).max(1);
        let select = format!(
            "SELECT row_to_json(q)::text, (q.{column})::text FROM {from} AS q \
             WHERE $1::text IS NULL OR q.{column} > $1::text::{ty} ORDER BY q.{column} LIMIT {batch}"
        );
        let start = match &ctx.checkpoint {
            Some(store) => store.load().await.map_err(store_error)?,
            None => None,
        };
        Ok(Self {
            client,
            select,
            batch: batch as usize,
            poll_interval: config
                .poll_interval
                .map_or(DEFAULT_POLL, |s| Duration::from_secs(u64::from(s.max(1)))),
            read_position: Mutex::new(start),
            checkpoint: ctx.checkpoint.clone(),
        })
    }

    /// The next batch after `position` (from the start when `None`).
    async fn read_after(&self, position: Option<&str>) -> Result<Vec<Record>, ConnectorError> {
        let rows = self
            .client
            .query(&self.select, &[&position])
            .await
            .map_err(ConnectorError::query)?;
        rows.iter()
            .map(|r| {
                let text: String = r.get(0);
                Ok(Record {
                    message: Message::new(
                        serde_json::from_str(&text).map_err(|e| ConnectorError::Data(e.to_string()))?,
                    ),
                    position: Position::Column(r.get::<_, Option<String>>(1).unwrap_or_default()),
                })
            })
            .collect()
    }
}

#[async_trait]
impl Source for PostgresSource {
    fn batch_size(&self) -> usize {
        self.batch
    }

    async fn read(&self) -> Result<Vec<Record>, ConnectorError> {
        loop {
            let after = self.read_position.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let rows = self.read_after(after.as_deref()).await?;
            if let Some(Record {
                position: Position::Column(last),
                ..
            }) = rows.last()
            {
                *self.read_position.lock().unwrap_or_else(|p| p.into_inner()) = Some(last.clone());
                return Ok(rows);
            }
            tokio::time::sleep(self.poll_interval).await;
        }
    }

    async fn commit(&self, done: &[Record]) -> Result<(), ConnectorError> {
        let (
            Some(store),
            Some(Record {
                position: Position::Column(last),
                ..
            }),
        ) = (&self.checkpoint, done.last())
        else {
            return Ok(());
        };
        store.save(last).await.map_err(store_error)
    }
}
