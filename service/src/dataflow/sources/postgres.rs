//! PostgreSQL source: polls a table (or a query) for rows whose incremental
//! column (an id or a change time) is past the read position, in order, a
//! batch at a time.

use std::time::Duration;

use serde_json::Value;

use crate::dataflow::ConnectorError;
use crate::dataflow::sql::{connect, quote};
use crate::model::connector_config::PostgresSourceConfig;

pub const DEFAULT_POLL: Duration = Duration::from_secs(5);
pub const DEFAULT_BATCH: u32 = 1000;

pub struct PostgresSource {
    client: tokio_postgres::Client,
    select: String,
    pub poll_interval: Duration,
}

/// One row and its read position (the incremental column as text).
pub struct Row {
    pub data: Value,
    pub position: String,
}

impl PostgresSource {
    pub async fn connect(config: &PostgresSourceConfig) -> Result<Self, ConnectorError> {
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
        let batch = config.batch_size.unwrap_or(DEFAULT_BATCH).max(1);
        let select = format!(
            "SELECT row_to_json(q)::text, (q.{column})::text FROM {from} AS q \
             WHERE $1::text IS NULL OR q.{column} > $1::text::{ty} ORDER BY q.{column} LIMIT {batch}"
        );
        Ok(Self {
            client,
            select,
            poll_interval: config
                .poll_interval
                .map_or(DEFAULT_POLL, |s| Duration::from_secs(u64::from(s.max(1)))),
        })
    }

    /// The next batch after `position` (from the start when `None`).
    pub async fn read(&self, position: Option<&str>) -> Result<Vec<Row>, ConnectorError> {
        let rows = self
            .client
            .query(&self.select, &[&position])
            .await
            .map_err(ConnectorError::query)?;
        rows.iter()
            .map(|r| {
                let text: String = r.get(0);
                Ok(Row {
                    data: serde_json::from_str(&text).map_err(|e| ConnectorError::Data(e.to_string()))?,
                    position: r.get::<_, Option<String>>(1).unwrap_or_default(),
                })
            })
            .collect()
    }
}
