//! PostgreSQL sink. A table with a JSONB `data` column (what
//! `autoCreateTable` makes) gets each message whole ("raw" mode); any other
//! table gets message keys into columns of the same names. Batches are one
//! statement; `upsertMode` updates on `conflictKey` (default: skip rows
//! whose key exists, so a replayed batch does not duplicate).

use async_trait::async_trait;
use serde_json::Value;

use super::Sink;
use crate::ConnectorError;
use crate::component::Component;
use crate::context::PipelineContext;
use crate::egress::EgressPolicy;
use crate::message::Message;
use crate::sql::{connect, quote, quote_ident};
use serde::Deserialize;
use sless_model::dataflow::SecretRef;
use sless_model::{FieldError, ValidationErrors};

/// `config` of a `postgresql` sink.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PostgresSinkConfig {
    pub connection_string: Option<String>,
    pub table: Option<String>,
    pub batch_size: Option<u32>,
    pub auto_create_table: Option<bool>,
    /// INSERT … ON CONFLICT … DO UPDATE instead of skipping duplicates.
    pub upsert_mode: Option<bool>,
    /// Column(s) for conflict detection in upsert mode; default the primary key.
    pub conflict_key: Option<String>,
    pub connection_string_secret_ref: Option<SecretRef>,
    pub table_secret_ref: Option<SecretRef>,
}

pub struct PostgresSink {
    client: tokio_postgres::Client,
    table: String,
    table_quoted: String,
    raw: bool,
    columns: Vec<String>,
    upsert_key: Option<Vec<String>>,
}

impl PostgresSink {
    pub async fn connect(config: &PostgresSinkConfig, egress: &EgressPolicy) -> Result<Self, ConnectorError> {
        let dsn = config
            .connection_string
            .as_deref()
            .ok_or_else(|| ConnectorError::Config("connectionString is required".into()))?;
        let table = config
            .table
            .clone()
            .ok_or_else(|| ConnectorError::Config("table is required".into()))?;
        let table_quoted = quote(&table)?;
        let client = connect(dsn, egress).await?;
        if config.auto_create_table == Some(true) {
            client
                .batch_execute(&format!(
                    "CREATE TABLE IF NOT EXISTS {table_quoted} (id BIGSERIAL PRIMARY KEY, data JSONB NOT NULL, \
                     created_at TIMESTAMPTZ NOT NULL DEFAULT now())"
                ))
                .await
                .map_err(ConnectorError::query)?;
        }
        let columns: Vec<(String, String)> = client
            .query(
                "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute \
                 WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                &[&table_quoted],
            )
            .await
            .map_err(ConnectorError::query)?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        if columns.is_empty() {
            return Err(ConnectorError::Config(format!(
                "table {table:?} has no columns (does it exist?)"
            )));
        }
        let raw = columns.iter().any(|(name, ty)| name == "data" && ty == "jsonb");
        let upsert_key = match (config.upsert_mode, &config.conflict_key) {
            (Some(true), Some(key)) => {
                let key: Vec<String> = key.split(',').map(|k| k.trim().to_owned()).collect();
                // Only the table's own columns: the key is spliced into SQL.
                if let Some(unknown) = key.iter().find(|k| !columns.iter().any(|(c, _)| c == *k)) {
                    return Err(ConnectorError::Config(format!(
                        "conflictKey {unknown:?} is not a column of {table:?}"
                    )));
                }
                Some(key)
            }
            (Some(true), None) => return Err(ConnectorError::Config("upsertMode needs conflictKey".into())),
            _ => None,
        };
        Ok(Self {
            client,
            table,
            table_quoted,
            raw,
            columns: columns.into_iter().map(|(n, _)| n).collect(),
            upsert_key,
        })
    }
}

impl Component for PostgresSink {
    const KIND: &'static str = "postgresql";
    type Config = PostgresSinkConfig;

    fn check(p: &PostgresSinkConfig, path: &str, errors: &mut ValidationErrors) {
        crate::sql::check_target(
            (&p.connection_string, &p.connection_string_secret_ref),
            (&p.table, &p.table_secret_ref),
            path,
            errors,
        );
        if p.batch_size == Some(0) {
            errors.push(FieldError::invalid(format!("{path}.batchSize"), "must be at least 1"));
        }
    }
}

#[async_trait]
impl super::Open for PostgresSink {
    async fn open(config: &PostgresSinkConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        Self::connect(config, &ctx.egress).await
    }
}

#[async_trait]
impl Sink for PostgresSink {
    fn target(&self) -> &str {
        &self.table
    }

    /// Writes a batch in one statement.
    async fn write(&self, messages: &[Message]) -> Result<(), ConnectorError> {
        if messages.is_empty() {
            return Ok(());
        }
        let batch: Vec<&Value> = messages.iter().map(|m| &m.data).collect();
        let docs = serde_json::to_string(&batch).map_err(|e| ConnectorError::Data(e.to_string()))?;
        let t = &self.table_quoted;
        let sql = if self.raw {
            format!("INSERT INTO {t} (data) SELECT value FROM jsonb_array_elements($1::text::jsonb)")
        } else {
            // Only columns some message has: the others keep their defaults.
            let present: Vec<&String> = self
                .columns
                .iter()
                .filter(|c| batch.iter().any(|m| m.get(c.as_str()).is_some()))
                .collect();
            if present.is_empty() {
                return Err(ConnectorError::Data(format!(
                    "no message key matches a column of {}",
                    self.table
                )));
            }
            let list = present.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ");
            let conflict = match &self.upsert_key {
                Some(key) => {
                    let key_list = key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
                    let updates: Vec<String> = present
                        .iter()
                        .filter(|c| !key.contains(c))
                        .map(|c| format!("{0} = EXCLUDED.{0}", quote_ident(c)))
                        .collect();
                    if updates.is_empty() {
                        format!("ON CONFLICT ({key_list}) DO NOTHING")
                    } else {
                        format!("ON CONFLICT ({key_list}) DO UPDATE SET {}", updates.join(", "))
                    }
                }
                None => "ON CONFLICT DO NOTHING".into(),
            };
            format!(
                "INSERT INTO {t} ({list}) SELECT {list} FROM jsonb_populate_recordset(NULL::{t}, $1::text::jsonb) {conflict}"
            )
        };
        self.client
            .execute(&sql, &[&docs])
            .await
            .map_err(ConnectorError::query)
            .map(drop)
    }
}
