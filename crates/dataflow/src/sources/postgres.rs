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
//!
//! A row becomes the JSON object `row_to_json` would make of it. Columns of
//! the common types (booleans, integers, text, json) are read in binary and
//! converted here, the rest through the server's `to_json`: converting in
//! the client spares the server the work of building and escaping JSON
//! text and the client that of parsing it again.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{FromSql, Type};

use super::polling::{Polling, RowPosition};
use super::{DEFAULT_BATCH, Position, Record, Source};
use crate::ConnectorError;
use crate::component::Component;
use crate::context::PipelineContext;
use crate::sql::positions::{names_positions, reserved};
use crate::sql::{connect, quote, quote_ident};
use sless_model::dataflow::SecretRef;
use sless_model::{FieldError, ValidationErrors};
use sless_runtime::sync::Unpoisoned;

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
    query: ReadQuery,
    /// The prepared read, made again when the source's columns change.
    reader: Mutex<Arc<Reader>>,
    batch: usize,
    polling: Polling,
}

/// What the read selects, before the source's columns are known.
struct ReadQuery {
    /// A quoted table, or a parenthesised query.
    from: String,
    /// The xmin guard of a table source.
    guard: &'static str,
    /// The incremental column and the id column, each as named and quoted.
    column: (String, String),
    id: (String, String),
    batch: u32,
}

/// The read prepared for the source's columns as they are.
struct Reader {
    statement: tokio_postgres::Statement,
    row: RowLayout,
    /// Whether the statement takes the row's id beside the incremental value.
    paired: bool,
}

/// Where a row's object comes from in what the statement returns; the
/// position's value and id are its last two columns.
enum RowLayout {
    /// Each key with the index of the column holding its value: the
    /// columns of `q.*` of the types [`JsonField`] reads, then `to_json`
    /// of the others. `q.*` also makes the server refuse the prepared
    /// statement once the columns change, so a new column is never missed.
    Columns(Vec<(String, usize)>),
    /// One `row_to_json(q)` column: a `query` whose names repeat, or
    /// columns of a type with no binary form.
    Whole,
}

/// The type name of `column` among `columns` (what the source returns).
fn column_type(columns: &[tokio_postgres::Column], column: &str) -> Result<String, ConnectorError> {
    columns
        .iter()
        .find(|c| c.name() == column)
        .map(|c| c.type_().name().to_owned())
        .ok_or_else(|| ConnectorError::Config(format!("the source has no column {column:?} to read incrementally")))
}

impl ReadQuery {
    /// Prepares the read for the columns the source has now.
    async fn prepare(&self, client: &tokio_postgres::Client) -> Result<Reader, ConnectorError> {
        let from = &self.from;
        let probe = client
            .prepare(&format!("SELECT * FROM {from} AS q LIMIT 0"))
            .await
            .map_err(ConnectorError::query)?;
        let columns = probe.columns();
        let ((column_name, column), (id_name, id)) = (&self.column, &self.id);
        // Positions compare as the columns' types, not as text.
        let ty = column_type(columns, column_name)?;
        // `q.*` comes back in binary, which a few types cannot give
        // (aclitem, some of extensions'), nor arrays or records of them.
        let types: Vec<u32> = columns.iter().map(|c| c.type_().oid()).collect();
        let binary: bool = client
            .query_one(
                "SELECT NOT EXISTS (SELECT 1 FROM pg_type t LEFT JOIN pg_type e ON e.oid = t.typelem AND t.typcategory = 'A' \
                   WHERE t.oid = ANY($1::oid[]) AND (t.typsend = 0 OR e.typsend = 0 OR EXISTS ( \
                     SELECT 1 FROM pg_attribute a JOIN pg_type f ON f.oid = a.atttypid \
                     WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND f.typsend = 0)))",
                &[&types],
            )
            .await
            .map_err(ConnectorError::query)?
            .get(0);
        let (row, layout) = row_select(columns, binary);
        let (guard, batch) = (self.guard, self.batch);
        let paired = column_name != id_name;
        // `q` is the table itself for a table source, so the guard can read
        // its system column `xmin`, which `row_to_json` leaves out.
        let select = if paired {
            let id_ty = column_type(columns, id_name)?;
            format!(
                "SELECT {row}, (q.{column})::text, (q.{id})::text FROM {from} AS q \
                 WHERE ($1::text IS NULL OR q.{column} > $1::text::{ty} \
                        OR (q.{column} = $1::text::{ty} AND $2::text IS NOT NULL AND q.{id} > $2::text::{id_ty})){guard} \
                 ORDER BY q.{column}, q.{id} LIMIT {batch}"
            )
        } else {
            format!(
                "SELECT {row}, (q.{column})::text, NULL FROM {from} AS q \
                 WHERE ($1::text IS NULL OR q.{column} > $1::text::{ty}){guard} ORDER BY q.{column} LIMIT {batch}"
            )
        };
        Ok(Reader {
            statement: client.prepare(&select).await.map_err(ConnectorError::query)?,
            row: layout,
            paired,
        })
    }
}

/// What selects a row of `q` with `columns`, and where its values land;
/// `binary` when every column has a binary form.
fn row_select(columns: &[tokio_postgres::Column], binary: bool) -> (String, RowLayout) {
    let mut names = std::collections::HashSet::new();
    if !binary || columns.is_empty() || !columns.iter().all(|c| names.insert(c.name())) {
        return ("row_to_json(q)".into(), RowLayout::Whole);
    }
    let mut select = vec!["q.*".to_owned()];
    let mut keys = Vec::with_capacity(columns.len());
    for (i, c) in columns.iter().enumerate() {
        let at = if JsonField::native(c.type_()) {
            i
        } else {
            select.push(format!("to_json(q.{})", quote_ident(c.name())));
            columns.len() + select.len() - 2
        };
        keys.push((c.name().to_owned(), at));
    }
    (select.join(", "), RowLayout::Columns(keys))
}

impl PostgresSource {
    pub async fn connect(config: &PostgresSourceConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let dsn = config
            .connection_string
            .as_deref()
            .ok_or_else(|| ConnectorError::Config("connectionString is required".into()))?;
        // Checked at create too; a table named through a secret only here.
        if let Some(text) = [&config.table, &config.query]
            .into_iter()
            .flatten()
            .find(|t| names_positions(t))
        {
            return Err(ConnectorError::Config(reserved(text)));
        }
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
        // Quoted before connecting: they are spliced into SQL.
        let named = |name: &Option<String>| {
            let name = name.clone().unwrap_or_else(|| "id".into());
            quote(&name).map(|quoted| (name, quoted))
        };
        let batch = config.batch_size.unwrap_or(DEFAULT_BATCH as u32).max(1);
        let query = ReadQuery {
            from,
            guard,
            column: named(&config.incremental_column)?,
            id: named(&config.id_column)?,
            batch,
        };
        let client = connect(dsn, &ctx.egress).await?;
        let reader = query.prepare(&client).await?;
        Ok(Self {
            client,
            query,
            reader: Mutex::new(Arc::new(reader)),
            batch: batch as usize,
            polling: Polling::start(config.poll_interval, ctx).await?,
        })
    }

    /// The next batch after `position` (from the start when `None`).
    async fn read_after(&self, position: Option<&RowPosition>) -> Result<Vec<(Record, RowPosition)>, ConnectorError> {
        let mut reader = self.reader.lock_unpoisoned().clone();
        let rows = match self.query_after(&reader, position).await {
            // "cached plan must not change result type": the columns
            // changed, so the read is prepared again for them, once.
            Err(e) if e.code() == Some(&SqlState::FEATURE_NOT_SUPPORTED) => {
                reader = Arc::new(self.query.prepare(&self.client).await?);
                *self.reader.lock_unpoisoned() = reader.clone();
                self.query_after(&reader, position).await
            }
            rows => rows,
        }
        .map_err(ConnectorError::query)?;
        rows_of(&reader, &rows)
    }

    async fn query_after(
        &self,
        reader: &Reader,
        position: Option<&RowPosition>,
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let value = position.map(|p| p.value.as_str());
        let id = position.and_then(|p| p.id.as_deref());
        if reader.paired {
            self.client.query(&reader.statement, &[&value, &id]).await
        } else {
            self.client.query(&reader.statement, &[&value]).await
        }
    }
}

/// The records of `rows`, each with its position.
fn rows_of(reader: &Reader, rows: &[tokio_postgres::Row]) -> Result<Vec<(Record, RowPosition)>, ConnectorError> {
    let width = reader.statement.columns().len() - 2;
    rows.iter()
        .map(|r| {
            let data = row_object(&reader.row, r)?;
            let position = RowPosition {
                value: r.get::<_, Option<String>>(width).unwrap_or_default(),
                id: r.get(width + 1),
            };
            Ok(position.record(data))
        })
        .collect()
}

/// The JSON object of a row.
fn row_object(layout: &RowLayout, row: &tokio_postgres::Row) -> Result<Value, ConnectorError> {
    let field = |i: usize| {
        row.try_get::<_, JsonField>(i)
            .map(|f| f.0)
            .map_err(|e| ConnectorError::Data(e.to_string()))
    };
    match layout {
        RowLayout::Whole => field(0),
        RowLayout::Columns(keys) => {
            let mut object = Map::new();
            for (key, at) in keys {
                object.insert(key.clone(), field(*at)?);
            }
            Ok(Value::Object(object))
        }
    }
}

/// A column's value as `row_to_json` writes it: SQL NULL is JSON null,
/// booleans and integers are themselves, text a string, json its value.
struct JsonField(Value);

impl JsonField {
    /// Types read in binary as they are; `json` is also what `to_json`
    /// gives for every other type.
    fn native(ty: &Type) -> bool {
        matches!(
            *ty,
            Type::BOOL
                | Type::INT2
                | Type::INT4
                | Type::INT8
                | Type::TEXT
                | Type::VARCHAR
                | Type::BPCHAR
                | Type::NAME
                | Type::JSON
                | Type::JSONB
        )
    }
}

impl<'a> FromSql<'a> for JsonField {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Self(match *ty {
            Type::BOOL => Value::Bool(bool::from_sql(ty, raw)?),
            Type::INT2 => i16::from_sql(ty, raw)?.into(),
            Type::INT4 => i32::from_sql(ty, raw)?.into(),
            Type::INT8 => i64::from_sql(ty, raw)?.into(),
            Type::JSON => serde_json::from_slice(raw)?,
            // jsonb's binary form is a version byte, 1, and the text.
            Type::JSONB => match raw.split_first() {
                Some((1, text)) => serde_json::from_slice(text)?,
                _ => return Err("jsonb in an unknown binary format".into()),
            },
            _ => Value::String(<&str>::from_sql(ty, raw)?.to_owned()),
        }))
    }

    fn from_sql_null(_: &Type) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Self(Value::Null))
    }

    fn accepts(ty: &Type) -> bool {
        Self::native(ty)
    }
}

impl Component for PostgresSource {
    const KIND: &'static str = "postgresql";
    type Config = PostgresSourceConfig;

    fn check(p: &PostgresSourceConfig, path: &str, errors: &mut ValidationErrors) {
        crate::component::check_target(
            (&p.connection_string, &p.connection_string_secret_ref),
            Some((&p.table, &p.table_secret_ref)),
            path,
            errors,
        );
        if p.poll_interval == Some(0) {
            errors.push(FieldError::invalid(
                format!("{path}.pollInterval"),
                "must be at least 1 second",
            ));
        }
        for (field, text) in [("table", &p.table), ("query", &p.query)] {
            if let Some(text) = text.as_deref().filter(|t| names_positions(t)) {
                let shown: String = text.chars().take(80).collect();
                errors.push(FieldError::invalid(format!("{path}.{field}"), reserved(&shown)));
            }
        }
    }
}

#[async_trait]
impl super::Open for PostgresSource {
    const RESUMABLE: bool = true;

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

    async fn commit(&self, done: &[Position]) -> Result<(), ConnectorError> {
        self.polling.commit(done).await
    }

    fn resume_text(&self, done: &[Position]) -> Option<String> {
        super::polling::resume_text(done)
    }
}
