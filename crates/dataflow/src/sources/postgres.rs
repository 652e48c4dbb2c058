//! PostgreSQL source: polls a table (or a query) for rows past the read
//! position, in order, a batch at a time. The position of the last written
//! row is the checkpoint.
//!
//! The position is total: the incremental column's value, and when that is
//! not unique (a change time) the `idColumn`'s value of the same row, so rows
//! sharing a change time are never split and skipped at a batch boundary.
//!
//! A table source reads only rows written by transactions older than every
//! transaction still running (the snapshot's xmin). A transaction that took
//! an id before a row already read and commits after it would otherwise be
//! skipped for ever; the price is that one long-running writing transaction
//! holds the source back until it ends. A `query` source cannot see row
//! versions and has no such guard (documented).

use async_trait::async_trait;
use serde::Deserialize;

use super::polling::{Polling, RowPosition};
use super::{DEFAULT_BATCH, Position, Record, Source};
use crate::ConnectorError;
use crate::component::Component;
use crate::context::PipelineContext;
use crate::message::Message;
use crate::sql::{connect, quote};
use sless_model::dataflow::SecretRef;
use sless_model::{FieldError, ValidationErrors};

/// `config` of a `postgresql` source.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PostgresSourceConfig {
    pub connection_string: Option<String>,
    pub table: Option<String>,
    /// Custom SQL instead of reading `table`.
    pub query: Option<String>,
    /// Seconds between polls. Default 5.
    pub poll_interval: Option<u32>,
    /// Rows read per poll. Default 1000.
    pub batch_size: Option<u32>,
    /// Column whose increasing values mark the read position (an id or a
    /// change time). Default `id`.
    pub incremental_column: Option<String>,
    /// A unique column that orders rows sharing an `incrementalColumn`
    /// value (a change time), so none is skipped at a batch boundary.
    /// Default `id`.
    pub id_column: Option<String>,
    pub connection_string_secret_ref: Option<SecretRef>,
    pub table_secret_ref: Option<SecretRef>,
}

pub struct PostgresSource {
    client: tokio_postgres::Client,
    select: String,
    /// Whether `select` takes the row's id beside the incremental value.
    paired: bool,
    batch: usize,
    polling: Polling,
}

/// The type name of `column` among `columns` (what the source returns).
fn column_type(columns: &[tokio_postgres::Column], column: &str) -> Result<String, ConnectorError> {
    columns
        .iter()
        .find(|c| c.name() == column)
        .map(|c| c.type_().name().to_owned())
        .ok_or_else(|| ConnectorError::Config(format!("the source has no column {column:?} to read incrementally")))
}

impl PostgresSource {
    pub async fn connect(config: &PostgresSourceConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let dsn = config
            .connection_string
            .as_deref()
            .ok_or_else(|| ConnectorError::Config("connectionString is required".into()))?;
        let column_name = config.incremental_column.clone().unwrap_or_else(|| "id".into());
        let id_name = config.id_column.clone().unwrap_or_else(|| "id".into());
        let column = quote(&column_name)?;
        let id = quote(&id_name)?;
        let (from, guard) = match (&config.query, &config.table) {
            (Some(query), _) => (format!("({query})"), ""),
            (None, Some(table)) => (
                quote(table)?,
                // Written before every running transaction began (xid ages
                // compare across wraparound; frozen rows are the oldest).
                " AND age(q.xmin) > age((pg_snapshot_xmin(pg_current_snapshot())::text::bigint % 4294967296)::text::xid)",
            ),
            (None, None) => return Err(ConnectorError::Config("table or query is required".into())),
        };
        let client = connect(dsn, &ctx.egress).await?;
        // Positions compare as the columns' types, not as text.
        let probe = client
            .prepare(&format!("SELECT * FROM {from} AS q LIMIT 0"))
            .await
            .map_err(ConnectorError::query)?;
        let ty = column_type(probe.columns(), &column_name)?;
        let batch = config.batch_size.unwrap_or(DEFAULT_BATCH as u32).max(1);
        // `q` is the table itself for a table source, so the guard can read
        // its system column `xmin`, which `row_to_json` leaves out.
        let select = if column_name == id_name {
            format!(
                "SELECT row_to_json(q)::text, (q.{column})::text, NULL FROM {from} AS q \
                 WHERE ($1::text IS NULL OR q.{column} > $1::text::{ty}){guard} ORDER BY q.{column} LIMIT {batch}"
            )
        } else {
            let id_ty = column_type(probe.columns(), &id_name)?;
            format!(
                "SELECT row_to_json(q)::text, (q.{column})::text, (q.{id})::text FROM {from} AS q \
                 WHERE ($1::text IS NULL OR q.{column} > $1::text::{ty} \
                        OR (q.{column} = $1::text::{ty} AND $2::text IS NOT NULL AND q.{id} > $2::text::{id_ty})){guard} \
                 ORDER BY q.{column}, q.{id} LIMIT {batch}"
            )
        };
        Ok(Self {
            client,
            select,
            paired: column_name != id_name,
            batch: batch as usize,
            polling: Polling::start(config.poll_interval, ctx.checkpoint.clone()).await?,
        })
    }

    /// The next batch after `position` (from the start when `None`).
    async fn read_after(&self, position: Option<&RowPosition>) -> Result<Vec<(Record, RowPosition)>, ConnectorError> {
        let value = position.map(|p| p.value.as_str());
        let id = position.and_then(|p| p.id.as_deref());
        let rows = if self.paired {
            self.client.query(&self.select, &[&value, &id]).await
        } else {
            self.client.query(&self.select, &[&value]).await
        }
        .map_err(ConnectorError::query)?;
        rows.iter()
            .map(|r| {
                let text: String = r.get(0);
                let data = serde_json::from_str(&text).map_err(|e| ConnectorError::Data(e.to_string()))?;
                let position = RowPosition {
                    value: r.get::<_, Option<String>>(1).unwrap_or_default(),
                    id: r.get(2),
                };
                Ok((
                    Record {
                        message: Message::new(data),
                        position: Position::Column(position.text()),
                    },
                    position,
                ))
            })
            .collect()
    }
}

impl Component for PostgresSource {
    const KIND: &'static str = "postgresql";
    type Config = PostgresSourceConfig;

    fn check(p: &PostgresSourceConfig, path: &str, errors: &mut ValidationErrors) {
        crate::sql::check_target(
            (&p.connection_string, &p.connection_string_secret_ref),
            (&p.table, &p.table_secret_ref),
            path,
            errors,
        );
        if p.poll_interval == Some(0) {
            errors.push(FieldError::invalid(
                format!("{path}.pollInterval"),
                "must be at least 1 second",
            ));
        }
    }
}

#[async_trait]
impl super::Open for PostgresSource {
    async fn open(config: &PostgresSourceConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        Self::connect(config, ctx).await
    }
}

#[async_trait]
impl Source for PostgresSource {
    fn batch_size(&self) -> usize {
        self.batch
    }

    async fn read(&self) -> Result<Vec<Record>, ConnectorError> {
        self.polling
            .read(|after| async move { self.read_after(after.as_ref()).await })
            .await
    }

    async fn commit(&self, done: &[Record]) -> Result<(), ConnectorError> {
        self.polling.commit(done).await
    }
}
