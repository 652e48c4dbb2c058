//! ClickHouse sink: a batch is one `INSERT … FORMAT JSONEachRow` over the
//! HTTP interface. A table with a `data String` column (what
//! `autoCreateTable` makes: a MergeTree table ordered by its insert time)
//! gets each message whole as JSON text; any other table gets message keys
//! into columns of the same names, keys without a column skipped and
//! columns without a key at their defaults.
//!
//! ClickHouse's inserts are idempotent only on replicated tables, so a batch
//! replayed after a crash is written twice into a plain MergeTree table
//! (at-least-once; docs/connectors.md).

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

use super::Sink;
use crate::ConnectorError;
use crate::clickhouse_client::{self, ClickHouse, literal};
use crate::component::Component;
use crate::context::PipelineContext;
use crate::message::Message;
use crate::sql::{quote, quote_ident};
use sless_model::dataflow::SecretRef;
use sless_model::{FieldError, ValidationErrors};

/// `config` of a `clickhouse` sink.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClickHouseSinkConfig {
    /// `http[s]://user:password@host:8123/database`.
    pub connection_string: Option<String>,
    pub table: Option<String>,
    pub batch_size: Option<u32>,
    /// Creates the table (`data String`, `created_at DateTime`, MergeTree)
    /// when it does not exist.
    pub auto_create_table: Option<bool>,
    pub connection_string_secret_ref: Option<SecretRef>,
    pub table_secret_ref: Option<SecretRef>,
}

pub struct ClickHouseSink {
    server: ClickHouse,
    table: String,
    table_quoted: String,
    raw: bool,
    columns: Vec<String>,
}

impl Component for ClickHouseSink {
    const KIND: &'static str = "clickhouse";
    type Config = ClickHouseSinkConfig;

    fn check(c: &ClickHouseSinkConfig, path: &str, errors: &mut ValidationErrors) {
        clickhouse_client::check(
            (&c.connection_string, &c.connection_string_secret_ref),
            Some((&c.table, &c.table_secret_ref)),
            path,
            errors,
        );
        if c.batch_size == Some(0) {
            errors.push(FieldError::invalid(format!("{path}.batchSize"), "must be at least 1"));
        }
    }
}

#[async_trait]
impl super::Open for ClickHouseSink {
    async fn open(config: &ClickHouseSinkConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let dsn = config
            .connection_string
            .as_deref()
            .ok_or_else(|| ConnectorError::Config("connectionString is required".into()))?;
        let table = config
            .table
            .clone()
            .ok_or_else(|| ConnectorError::Config("table is required".into()))?;
        let table_quoted = quote(&table)?;
        let server = ClickHouse::connect(dsn, &ctx.egress).await?;
        if config.auto_create_table == Some(true) {
            server
                .query(&format!(
                    "CREATE TABLE IF NOT EXISTS {table_quoted} (data String, created_at DateTime DEFAULT now()) \
                     ENGINE = MergeTree() ORDER BY created_at"
                ))
                .await?;
        }
        let (database, name) = match table.split_once('.') {
            Some((db, name)) => (literal(db), literal(name)),
            None => ("currentDatabase()".to_owned(), literal(&table)),
        };
        let columns: Vec<(String, String)> = server
            .query(&format!(
                "SELECT name, type FROM system.columns WHERE database = {database} AND table = {name} \
                 FORMAT JSONEachRow"
            ))
            .await?
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter_map(|c| Some((c["name"].as_str()?.to_owned(), c["type"].as_str()?.to_owned())))
            .collect();
        if columns.is_empty() {
            return Err(ConnectorError::Config(format!(
                "table {table:?} has no columns (does it exist?)"
            )));
        }
        let raw = columns.iter().any(|(name, ty)| name == "data" && ty == "String");
        Ok(Self {
            server,
            table,
            table_quoted,
            raw,
            columns: columns.into_iter().map(|(name, _)| name).collect(),
        })
    }
}

#[async_trait]
impl Sink for ClickHouseSink {
    fn target(&self) -> &str {
        &self.table
    }

    async fn write(&self, messages: &[Message]) -> Result<(), ConnectorError> {
        if messages.is_empty() {
            return Ok(());
        }
        let t = &self.table_quoted;
        let mut rows = String::new();
        let statement = if self.raw {
            for m in messages {
                let row = serde_json::json!({ "data": m.data.to_string() });
                rows.push_str(&row.to_string());
                rows.push('\n');
            }
            format!("INSERT INTO {t} (data) FORMAT JSONEachRow")
        } else {
            // Only columns some message has, so the others take their defaults.
            let present: Vec<&String> = self
                .columns
                .iter()
                .filter(|c| messages.iter().any(|m| m.data.get(c.as_str()).is_some()))
                .collect();
            if present.is_empty() {
                return Err(ConnectorError::Data(format!(
                    "no message key matches a column of {}",
                    self.table
                )));
            }
            for m in messages {
                rows.push_str(&m.data.to_string());
                rows.push('\n');
            }
            let list = present.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ");
            format!("INSERT INTO {t} ({list}) FORMAT JSONEachRow")
        };
        self.server.insert(&statement, rows).await
    }
}
