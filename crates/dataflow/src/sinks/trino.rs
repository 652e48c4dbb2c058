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
            (Some(true), _) if raw => {
                return Err(ConnectorError::Config(format!(
                    "upsertMode writes message keys into columns: {table:?} takes whole messages (a data varchar column)"
                )));
            }
            (Some(true), Some(key)) => Some(
                key.split(',')
                    .map(|k| {
                        column_named(&columns, k.trim()).map(|c| c.name.clone()).ok_or_else(|| {
                            ConnectorError::Config(format!("conflictKey {:?} is not a column of {table:?}", k.trim()))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
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

/// The column `name` names: itself, else one differing in case only (Trino
/// keeps names in lower case; a message key `userId` fills `userid`).
fn column_named<'a>(columns: &'a [Column], name: &str) -> Option<&'a Column> {
    columns
        .iter()
        .find(|c| c.name == name)
        .or_else(|| columns.iter().find(|c| c.name.eq_ignore_ascii_case(name)))
}

/// `message`'s value for `column`: its key of the same name, else one
/// differing in case only.
fn field<'a>(message: &'a Message, column: &Column) -> Option<&'a Value> {
    let object = message.data.as_object()?;
    object.get(&column.name).or_else(|| {
        object
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(&column.name))
            .map(|(_, v)| v)
    })
}

/// Messages that fill the same columns: the columns, and each message's row.
type Group<'a> = (Vec<&'a Column>, Vec<String>);

impl TrinoSink {
    /// The batch's messages by the columns they fill, in groups written by
    /// statements of their own: a column a message has no key for keeps its
    /// default (or, merged, its value), whatever the rest of the batch has.
    /// Each group: its columns, and each message's row of [`carried`]
    /// values as JSON text.
    fn groups(&self, messages: &[Message]) -> Result<Vec<Group<'_>>, ConnectorError> {
        if self.raw {
            let data = self.columns.iter().filter(|c| c.name == "data").collect();
            let rows = messages
                .iter()
                .map(|m| Value::Array(vec![Value::String(m.data.to_string())]).to_string())
                .collect();
            return Ok(vec![(data, rows)]);
        }
        let mut groups: Vec<Group<'_>> = Vec::new();
        for m in messages {
            // The key always, so a merge finds its row.
            let (present, values): (Vec<&Column>, Vec<Option<&Value>>) = self
                .columns
                .iter()
                .map(|c| (c, field(m, c)))
                .filter(|(c, value)| value.is_some() || self.upsert_key.as_ref().is_some_and(|k| k.contains(&c.name)))
                .unzip();
            if present.is_empty() {
                return Err(ConnectorError::Data(format!(
                    "no message key matches a column of {}",
                    self.table
                )));
            }
            if let Some(column) = present.iter().find(|c| !writable(&c.ty)) {
                return Err(ConnectorError::Config(format!(
                    "column {:?} of {}: sless cannot write a {} through Trino (Trino casts no JSON to it)",
                    column.name, self.table, column.ty
                )));
            }
            let row = Value::Array(present.iter().zip(values).map(|(c, v)| carried(&c.ty, v)).collect()).to_string();
            match groups.iter_mut().find(|(columns, _)| *columns == present) {
                Some((_, rows)) => rows.push(row),
                None => groups.push((present, vec![row])),
            }
        }
        Ok(groups)
    }

    /// The last message of each key, in the order of their last appearance:
    /// MERGE refuses two source rows for one target row. Keys compare as
    /// they are written (`1` and `"1"` are one key of a bigint column).
    fn last_of_each_key<'a>(
        &self,
        key: &[String],
        messages: &'a [Message],
    ) -> Result<Vec<&'a Message>, ConnectorError> {
        let key: Vec<&Column> = key.iter().filter_map(|k| column_named(&self.columns, k)).collect();
        let mut last: HashMap<String, usize> = HashMap::new();
        for (i, m) in messages.iter().enumerate() {
            let values: Vec<Value> = key.iter().map(|c| carried(&c.ty, field(m, c))).collect();
            if values.iter().any(Value::is_null) {
                return Err(ConnectorError::Data(format!(
                    "a message has no value for the conflictKey of {}",
                    self.table
                )));
            }
            last.insert(Value::Array(values).to_string(), i);
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

impl TrinoSink {
    /// `rows` into `columns`, in statements that fit Trino's length, in order.
    async fn write_rows(&self, columns: &[&Column], rows: &[String]) -> Result<(), ConnectorError> {
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
            self.server.run(&self.statement(columns, &rows[start..end])).await?;
            start = end;
        }
        Ok(())
    }
}

/// Whether Trino can take a value of type `ty` from JSON, as
/// [`rows_select`] sends it: nested types only of types it casts JSON to.
fn writable(ty: &str) -> bool {
    let nested = ["array(", "map(", "row("].iter().any(|p| ty.starts_with(p));
    let uncastable = [
        "timestamp",
        "date",
        "time",
        "uuid",
        "char",
        "varbinary",
        "interval",
        "ipaddress",
    ];
    !nested
        || !ty
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|word| uncastable.contains(&word))
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
        for (columns, rows) in self.groups(messages)? {
            self.write_rows(&columns, &rows).await?;
        }
        Ok(())
    }
}
