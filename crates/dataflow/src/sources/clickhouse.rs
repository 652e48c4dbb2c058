//! ClickHouse source: polls a table (or a query) over the HTTP interface for
//! rows past the read position, in order, a batch at a time, as PostgreSQL's
//! source does; the position of the last written row is the checkpoint.
//!
//! ClickHouse has no transactions to wait for: a row inserted later with a
//! position below one already read is not read. Write rows with increasing
//! positions (an id, an insert time), as append-only tables usually are.

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

use super::polling::{Polling, RowPosition};
use super::{DEFAULT_BATCH, Position, Record, Source};
use crate::ConnectorError;
use crate::clickhouse_client::{self, ClickHouse, literal};
use crate::component::Component;
use crate::context::PipelineContext;
use crate::sql::quote;
use sless_model::dataflow::SecretRef;
use sless_model::{FieldError, ValidationErrors};

/// `config` of a `clickhouse` source.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClickHouseSourceConfig {
    /// `http[s]://user:password@host:8123/database`.
    pub connection_string: Option<String>,
    pub table: Option<String>,
    /// A SELECT to read instead of `table`.
    pub query: Option<String>,
    /// Seconds between polls. Default 5.
    pub poll_interval: Option<u32>,
    /// Rows read per poll. Default 1000.
    pub batch_size: Option<u32>,
    /// Column whose increasing values mark the read position. Default `id`.
    pub incremental_column: Option<String>,
    /// A unique column that orders rows sharing an `incrementalColumn`
    /// value. Default `id`.
    pub id_column: Option<String>,
    pub connection_string_secret_ref: Option<SecretRef>,
    pub table_secret_ref: Option<SecretRef>,
}

pub struct ClickHouseSource {
    server: ClickHouse,
    from: String,
    column: String,
    column_type: String,
    /// The id column and its type, when it is not the incremental column.
    id: Option<(String, String)>,
    column_name: String,
    id_name: String,
    batch: usize,
    polling: Polling,
    /// What its answers hold of the tenant's memory while read and parsed.
    memory: crate::budget::Allowance,
}

/// `name`'s type among the columns `DESCRIBE` listed.
fn column_type(described: &str, name: &str) -> Result<String, ConnectorError> {
    described
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|c| c["name"] == name)
        .and_then(|c| c["type"].as_str().map(str::to_owned))
        .ok_or_else(|| ConnectorError::Config(format!("the source has no column {name:?} to read incrementally")))
}

impl ClickHouseSource {
    /// The query for the rows after `position`.
    fn select_after(&self, position: Option<&RowPosition>) -> String {
        let (c, ty) = (&self.column, &self.column_type);
        let cast = |value: &str, ty: &str| format!("CAST({} AS {ty})", literal(value));
        let filter = match (position, &self.id) {
            (None, _) => String::new(),
            (Some(p), Some((id, id_ty))) if p.id.is_some() => format!(
                " WHERE q.{c} > {v} OR (q.{c} = {v} AND q.{id} > {i})",
                v = cast(&p.value, ty),
                i = cast(p.id.as_deref().unwrap_or_default(), id_ty)
            ),
            (Some(p), _) => format!(" WHERE q.{c} > {}", cast(&p.value, ty)),
        };
        let order = match &self.id {
            Some((id, _)) => format!("q.{c}, q.{id}"),
            None => format!("q.{c}"),
        };
        format!(
            "SELECT * FROM {} AS q{filter} ORDER BY {order} LIMIT {} FORMAT JSONEachRow",
            self.from, self.batch
        )
    }

    async fn read_after(&self, position: Option<RowPosition>) -> Result<Vec<(Record, RowPosition)>, ConnectorError> {
        let select = self.select_after(position.as_ref());
        // Held until the rows are parsed: the answer and its records at once.
        let (rows, _held) = self.server.query_held(&select, &self.memory).await?;
        rows.lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                let data: Value = serde_json::from_str(line).map_err(|e| ConnectorError::Data(e.to_string()))?;
                let id = self.id.as_ref().map(|_| self.id_name.as_str());
                Ok(RowPosition::of(&data, &self.column_name, id).record(data))
            })
            .collect()
    }
}

impl Component for ClickHouseSource {
    const KIND: &'static str = "clickhouse";
    type Config = ClickHouseSourceConfig;

    fn check(c: &ClickHouseSourceConfig, path: &str, errors: &mut ValidationErrors) {
        let table = (c.query.is_none()).then_some((&c.table, &c.table_secret_ref));
        clickhouse_client::check(
            (&c.connection_string, &c.connection_string_secret_ref),
            table,
            path,
            errors,
        );
        if c.poll_interval == Some(0) {
            errors.push(FieldError::invalid(
                format!("{path}.pollInterval"),
                "must be at least 1 second",
            ));
        }
        if c.batch_size == Some(0) {
            errors.push(FieldError::invalid(format!("{path}.batchSize"), "must be at least 1"));
        }
    }
}

#[async_trait]
impl super::Open for ClickHouseSource {
    const RESUMABLE: bool = true;

    async fn open(config: &ClickHouseSourceConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let dsn = config
            .connection_string
            .as_deref()
            .ok_or_else(|| ConnectorError::Config("connectionString is required".into()))?;
        let from = match (&config.query, &config.table) {
            (Some(query), _) => format!("({query})"),
            (None, Some(table)) => quote(table)?,
            (None, None) => return Err(ConnectorError::Config("table or query is required".into())),
        };
        let column_name = config.incremental_column.clone().unwrap_or_else(|| "id".into());
        let id_name = config.id_column.clone().unwrap_or_else(|| "id".into());
        let server = ClickHouse::connect(dsn, &ctx.egress).await?;
        // The server's words stay with it: the spec's own names say where.
        let described = server
            .query(&format!("DESCRIBE TABLE {from} FORMAT JSONEachRow"))
            .await
            .map_err(|e| match e {
                ConnectorError::Config(m) => ConnectorError::Config(match &config.query {
                    Some(_) => format!("query: {m}"),
                    None => format!("table {from}: {m}"),
                }),
                other => other,
            })?;
        let incremental_type = column_type(&described, &column_name)?;
        let id = if id_name == column_name {
            None
        } else {
            Some((quote(&id_name)?, column_type(&described, &id_name)?))
        };
        Ok(Self {
            server,
            from,
            column: quote(&column_name)?,
            column_type: incremental_type,
            id,
            column_name,
            id_name,
            batch: config.batch_size.unwrap_or(DEFAULT_BATCH as u32).max(1) as usize,
            polling: Polling::start(config.poll_interval, ctx).await?,
            memory: ctx.budget.memory.clone(),
        })
    }
}

#[async_trait]
impl Source for ClickHouseSource {
    fn batch_size(&self) -> usize {
        self.batch
    }

    async fn read(&self) -> Result<Vec<Record>, ConnectorError> {
        self.polling.read(|after| self.read_after(after)).await
    }

    async fn commit(&self, done: &[Position]) -> Result<(), ConnectorError> {
        self.polling.commit(done).await
    }

    fn resume_text(&self, done: &[Position]) -> Option<String> {
        super::polling::resume_text(done)
    }
}
