//! Trino source: polls a table (or a query) through Trino for rows past the
//! read position, in order, a batch at a time, as the PostgreSQL and
//! ClickHouse sources do; the position of the last written row is the
//! checkpoint (and what an exactly-once sink stores).
//!
//! Trino reads the catalog's data as it is when the statement runs: a row
//! committed later with a position below one already read is not read.
//! Write rows with increasing positions (an id, an insert time). Rows whose
//! position (or id) is NULL are not read.

use async_trait::async_trait;
use serde_json::Value;

use super::polling::{Polling, RowPosition};
use super::{DEFAULT_BATCH, Position, Record, Source};
use crate::ConnectorError;
use crate::component::Component;
use crate::context::PipelineContext;
use crate::trino_client::{Column, Trino, TrinoConfig, literal, quote_ident, quote_table};
use sless_model::ValidationErrors;
use sless_model::dataflow::Role;

pub struct TrinoSource {
    server: Trino,
    /// `(query)` or the quoted table.
    from: String,
    /// The incremental column, quoted, and its Trino type.
    column: (String, String),
    /// The id column, quoted, and its type, when it is not the incremental column.
    id: Option<(String, String)>,
    column_name: String,
    id_name: String,
    batch: usize,
    polling: Polling,
    /// What its answers hold of the tenant's memory while read and parsed.
    memory: crate::budget::Allowance,
}

/// `name` among `columns`: quoted, with its type.
fn typed(columns: &[Column], name: &str) -> Result<(String, String), ConnectorError> {
    columns
        .iter()
        .find(|c| c.name == name)
        .map(|c| (quote_ident(&c.name), c.ty.clone()))
        .ok_or_else(|| ConnectorError::Config(format!("the source has no column {name:?} to read incrementally")))
}

impl TrinoSource {
    /// The statement for the rows after `position`.
    fn select_after(&self, position: Option<&RowPosition>) -> String {
        let (c, ty) = &self.column;
        let cast = |value: &str, ty: &str| format!("CAST({} AS {ty})", literal(value));
        // Rows without a position are never read: Trino sorts NULLs last,
        // and a batch ending on one would have no position to go on from.
        let mut filter = format!(" WHERE q.{c} IS NOT NULL");
        if let Some((id, _)) = &self.id {
            filter.push_str(&format!(" AND q.{id} IS NOT NULL"));
        }
        match (position, &self.id) {
            (None, _) => {}
            (Some(p), Some((id, id_ty))) if p.id.is_some() => filter.push_str(&format!(
                " AND (q.{c} > {v} OR (q.{c} = {v} AND q.{id} > {i}))",
                v = cast(&p.value, ty),
                i = cast(p.id.as_deref().unwrap_or_default(), id_ty)
            )),
            (Some(p), _) => filter.push_str(&format!(" AND q.{c} > {}", cast(&p.value, ty))),
        }
        let order = match &self.id {
            Some((id, _)) => format!("q.{c}, q.{id}"),
            None => format!("q.{c}"),
        };
        format!(
            "SELECT * FROM {} q{filter} ORDER BY {order} LIMIT {}",
            self.from, self.batch
        )
    }

    async fn read_after(&self, position: Option<RowPosition>) -> Result<Vec<(Record, RowPosition)>, ConnectorError> {
        let select = self.select_after(position.as_ref());
        // Held until the rows are records: the answer and its records at once.
        let (answer, _held) = self.server.run_held(&select, &self.memory, self.batch).await?;
        Ok(answer
            .objects()
            .into_iter()
            .map(|row| {
                let row = Value::Object(row);
                let id = self.id.as_ref().map(|_| self.id_name.as_str());
                RowPosition::of(&row, &self.column_name, id).record(row)
            })
            .collect())
    }
}

impl Component for TrinoSource {
    const KIND: &'static str = "trino";
    type Config = TrinoConfig;

    fn check(c: &TrinoConfig, path: &str, errors: &mut ValidationErrors) {
        c.check(Role::Source, path, errors);
    }
}

#[async_trait]
impl super::Open for TrinoSource {
    const RESUMABLE: bool = true;

    async fn open(config: &TrinoConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let from = match &config.query {
            Some(query) => format!("({query})"),
            None => quote_table(config.table_name()?)?,
        };
        let column_name = config.incremental_column.clone().unwrap_or_else(|| "id".into());
        let id_name = config.id_column.clone().unwrap_or_else(|| "id".into());
        let server = Trino::connect(config, &ctx.egress).await?;
        // The server's words stay with it: the spec's own names say where.
        let columns = server
            .run(&format!("SELECT * FROM {from} q LIMIT 0"))
            .await
            .map_err(|e| match e {
                ConnectorError::Config(m) => ConnectorError::Config(match &config.query {
                    Some(_) => format!("query: {m}"),
                    None => format!("table {from}: {m}"),
                }),
                other => other,
            })?
            .columns;
        let column = typed(&columns, &column_name)?;
        let id = (id_name != column_name)
            .then(|| typed(&columns, &id_name))
            .transpose()?;
        Ok(Self {
            server,
            from,
            column,
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
impl Source for TrinoSource {
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
