//! Trino sink: a batch is written through Trino by `INSERT … SELECT`, or by
//! `MERGE` on `conflictKey` with `upsertMode`, its rows in one JSON literal
//! cast to the columns' types ([`rows_select`]), in statements that fit
//! Trino's statement length. A table with a `data varchar` column (what
//! `autoCreateTable` makes) gets each message whole as JSON text; any other
//! table gets message keys into columns of the same names, keys without a
//! column skipped.
//!
//! Trino writes through its catalogs without a transaction across
//! statements (its JDBC catalogs commit each statement), so a batch
//! replayed after a crash is inserted again (at-least-once); with
//! `upsertMode` the replay merges onto the same keys, so the table ends as
//! if each message were written once.

use std::collections::HashMap;

use async_trait::async_trait;
use serde_json::Value;

use super::Sink;
use crate::ConnectorError;
use crate::component::Component;
use crate::context::PipelineContext;
use crate::message::Message;
use crate::trino_client::{
    Column, MAX_STATEMENT_BYTES, Trino, TrinoConfig, carried, quote_ident, quote_table, rows_select,
};
use sless_model::ValidationErrors;
use sless_model::dataflow::Role;

pub struct TrinoSink {
    server: Trino,
    table: String,
    table_quoted: String,
    raw: bool,
    columns: Vec<Column>,
    /// The key columns of `upsertMode`.
    upsert_key: Option<Vec<String>>,
    /// Most rows in one statement.
    rows_per_statement: usize,
}

impl Component for TrinoSink {
    const KIND: &'static str = "trino";
    type Config = TrinoConfig;

    fn check(c: &TrinoConfig, path: &str, errors: &mut ValidationErrors) {
        c.check(Role::Sink, path, errors);
    }
}

#[async_trait]
impl super::Open for TrinoSink {
    async fn open(config: &TrinoConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let table = config.table_name()?.to_owned();
        let table_quoted = quote_table(&table)?;
        let server = Trino::connect(config, &ctx.egress).await?;
        let named = |e: ConnectorError| match e {
            ConnectorError::Config(m) => ConnectorError::Config(format!("table {table:?}: {m}")),
            other => other,
        };
        if config.auto_create_table == Some(true) {
            server
                .run(&format!("CREATE TABLE IF NOT EXISTS {table_quoted} (data varchar)"))
                .await
                .map_err(named)?;
        }
        let columns = server
            .run(&format!("SELECT * FROM {table_quoted} LIMIT 0"))
            .await
            .map_err(named)?
            .columns;
        let raw = columns.iter().any(|c| c.name == "data" && c.ty.starts_with("varchar"));
        let upsert_key = match (config.upsert_mode, &config.conflict_key) {
            (Some(true), Some(key)) => {
                let key: Vec<String> = key.split(',').map(|k| k.trim().to_owned()).collect();
                if let Some(unknown) = key.iter().find(|k| !columns.iter().any(|c| &c.name == *k)) {
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
            server,
            table,
            table_quoted,
            raw,
            columns,
            upsert_key,
            rows_per_statement: config.batch_size.map_or(usize::MAX, |n| n.max(1) as usize),
        })
    }
}

impl TrinoSink {
    /// The columns written and each message's row of [`carried`] values,
    /// as JSON text.
    fn rows(&self, messages: &[Message]) -> Result<(Vec<&Column>, Vec<String>), ConnectorError> {
        if self.raw {
            let data = self.columns.iter().filter(|c| c.name == "data").collect();
            let rows = messages
                .iter()
                .map(|m| Value::Array(vec![Value::String(m.data.to_string())]).to_string())
                .collect();
            return Ok((data, rows));
        }
        // Only columns some message has (the key always), so the others
        // keep their defaults.
        let present: Vec<&Column> = self
            .columns
            .iter()
            .filter(|c| {
                self.upsert_key.as_ref().is_some_and(|k| k.contains(&c.name))
                    || messages.iter().any(|m| m.data.get(c.name.as_str()).is_some())
            })
            .collect();
        if present.is_empty() {
            return Err(ConnectorError::Data(format!(
                "no message key matches a column of {}",
                self.table
            )));
        }
        let rows = messages
            .iter()
            .map(|m| {
                let row: Vec<Value> = present
                    .iter()
                    .map(|c| carried(&c.ty, m.data.get(c.name.as_str())))
                    .collect();
                Value::Array(row).to_string()
            })
            .collect();
        Ok((present, rows))
    }

    /// The last message of each key, in the order of their last appearance:
    /// MERGE refuses two source rows for one target row.
    fn last_of_each_key<'a>(
        &self,
        key: &[String],
        messages: &'a [Message],
    ) -> Result<Vec<&'a Message>, ConnectorError> {
        let mut last: HashMap<String, usize> = HashMap::new();
        for (i, m) in messages.iter().enumerate() {
            let values: Vec<&Value> = key
                .iter()
                .map(|k| m.data.get(k.as_str()).unwrap_or(&Value::Null))
                .collect();
            if values.iter().any(|v| v.is_null()) {
                return Err(ConnectorError::Data(format!(
                    "a message has no value for the conflictKey of {}",
                    self.table
                )));
            }
            last.insert(serde_json::to_string(&values).unwrap_or_default(), i);
        }
        let mut kept: Vec<usize> = last.into_values().collect();
        kept.sort_unstable();
        Ok(kept.into_iter().map(|i| &messages[i]).collect())
    }

    /// One statement of `rows` (JSON arrays) into `columns`.
    fn statement(&self, columns: &[&Column], rows: &[String]) -> String {
        let t = &self.table_quoted;
        let list = columns
            .iter()
            .map(|c| quote_ident(&c.name))
            .collect::<Vec<_>>()
            .join(", ");
        let select = rows_select(columns, &format!("[{}]", rows.join(",")));
        let Some(key) = &self.upsert_key else {
            return format!("INSERT INTO {t} ({list}) {select}");
        };
        let on = key
            .iter()
            .map(|k| format!("t.{q} = s.{q}", q = quote_ident(k)))
            .collect::<Vec<_>>()
            .join(" AND ");
        let set = columns
            .iter()
            .filter(|c| !key.contains(&c.name))
            .map(|c| format!("{q} = s.{q}", q = quote_ident(&c.name)))
            .collect::<Vec<_>>();
        let matched = if set.is_empty() {
            String::new()
        } else {
            format!(" WHEN MATCHED THEN UPDATE SET {}", set.join(", "))
        };
        let inserted = columns
            .iter()
            .map(|c| format!("s.{}", quote_ident(&c.name)))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "MERGE INTO {t} t USING ({select}) s ON {on}{matched} \
             WHEN NOT MATCHED THEN INSERT ({list}) VALUES ({inserted})"
        )
    }
}

/// The length of `row` inside the statement's string literal, where each
/// quote is doubled.
fn quoted_len(row: &str) -> usize {
    row.len() + row.matches('\'').count()
}

#[async_trait]
impl Sink for TrinoSink {
    fn target(&self) -> &str {
        &self.table
    }

    async fn write(&self, messages: &[Message]) -> Result<(), ConnectorError> {
        if messages.is_empty() {
            return Ok(());
        }
        let kept: Vec<Message>;
        let messages = match &self.upsert_key {
            Some(key) if !self.raw => {
                kept = self.last_of_each_key(key, messages)?.into_iter().cloned().collect();
                &kept[..]
            }
            _ => messages,
        };
        let (columns, rows) = self.rows(messages)?;
        // Statements that fit Trino's length, in order.
        if rows.iter().any(|row| quoted_len(row) + 1 > MAX_STATEMENT_BYTES) {
            return Err(ConnectorError::Data(format!(
                "a message is longer than one Trino statement may be ({} KiB)",
                MAX_STATEMENT_BYTES >> 10
            )));
        }
        let mut start = 0;
        while start < rows.len() {
            let (mut end, mut bytes) = (start, 0);
            while end < rows.len() && end - start < self.rows_per_statement {
                bytes += quoted_len(&rows[end]) + 1;
                if bytes > MAX_STATEMENT_BYTES && end > start {
                    break;
                }
                end += 1;
            }
            self.server.run(&self.statement(&columns, &rows[start..end])).await?;
            start = end;
        }
        Ok(())
    }
}
