//! Nessie sink: each batch is one Parquet data file in the table's object
//! store, appended to an Iceberg table of a Nessie branch by one snapshot
//! committed through Nessie's Iceberg REST catalog. A table whose only
//! column is `data string` (what `autoCreateTable` makes) takes each
//! message whole as JSON text; any other table takes message keys into the
//! columns of the same names ([`crate::iceberg_rows`]).
//!
//! A commit another writer beat is made again on the new snapshot (Iceberg
//! appends never conflict on data), a few times, by Iceberg's commit. With
//! `exactlyOnce` (on where the source can resume) the same commit sets the
//! dataflow's table property ([`PositionProperty`]) to the source position,
//! sealed with the tenant's key: a commit whose outcome was unknown (the
//! answer was lost) and is sent again finds its position already there and
//! is not made twice, and a restart resumes the source from it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arrow_schema::SchemaRef;
use async_trait::async_trait;
use iceberg::spec::{DataFileFormat, NestedField, PrimitiveType, Schema, Type};
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{DefaultFileNameGenerator, DefaultLocationGenerator};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use iceberg::{Catalog, ErrorKind, TableCreation};
use parquet::file::properties::WriterProperties;
use serde_json::{Map, Value};

use super::Sink;
use crate::ConnectorError;
use crate::component::Component;
use crate::context::{PipelineContext, PositionsKey};
use crate::iceberg_rows;
use crate::message::Message;
use crate::nessie_client::{Guarded, Nessie, NessieConfig, PositionProperty, catalog_error};
use sless_model::ValidationErrors;
use sless_model::dataflow::Role;

/// Commits tried before a batch is given back to be retried: each one
/// another writer beat is made again on the new snapshot.
const COMMIT_ATTEMPTS: u32 = 8;

/// Largest data file written: below what the object store writes whole.
const TARGET_FILE_BYTES: usize = crate::s3::MAX_OBJECT / 2;

pub struct NessieSink {
    nessie: Nessie,
    /// The table takes messages whole (its only column is `data string`).
    raw: bool,
    exactly_once: Option<bool>,
    positions_key: Option<PositionsKey>,
    position: PositionProperty,
    /// Begins the name of each data file this sink writes.
    file_prefix: String,
    files: AtomicU64,
}

impl Component for NessieSink {
    const KIND: &'static str = "nessie";
    type Config = NessieConfig;

    fn check(c: &NessieConfig, path: &str, errors: &mut ValidationErrors) {
        c.check(Role::Sink, path, errors);
    }
}

/// The table `autoCreateTable` makes: messages whole, as JSON text.
fn raw_schema() -> Result<Schema, ConnectorError> {
    Schema::builder()
        .with_fields(vec![
            NestedField::optional(1, "data", Type::Primitive(PrimitiveType::String)).into(),
        ])
        .build()
        .map_err(|e| ConnectorError::Config(e.message().to_owned()))
}

/// Makes the namespace and the table where the spec asks for them.
async fn create_missing(nessie: &Nessie, config: &NessieConfig) -> Result<(), ConnectorError> {
    let catalog = &nessie.catalog;
    let what = &nessie.target;
    if catalog
        .table_exists(&nessie.ident)
        .await
        .map_err(|e| catalog_error(&e, what))?
    {
        return Ok(());
    }
    if config.auto_create_table != Some(true) {
        return Err(ConnectorError::Config(format!(
            "{what}: no such table (autoCreateTable makes one)"
        )));
    }
    if config.auto_create_namespace != Some(false)
        && let Err(e) = catalog.create_namespace(&nessie.namespace, HashMap::new()).await
        && e.kind() != ErrorKind::NamespaceAlreadyExists
    {
        return Err(catalog_error(&e, what));
    }
    let creation = TableCreation::builder()
        .name(nessie.ident.name().to_owned())
        .schema(raw_schema()?)
        .build();
    match catalog.create_table(&nessie.namespace, creation).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::TableAlreadyExists => Ok(()),
        Err(e) => Err(catalog_error(&e, what)),
    }
}

/// The table's Arrow schema, if the sink can write it.
fn writable_schema(table: &Table, what: &str) -> Result<SchemaRef, ConnectorError> {
    let metadata = table.metadata();
    if !metadata.default_partition_spec().is_unpartitioned() {
        return Err(ConnectorError::Config(format!(
            "{what}: the table is partitioned; the nessie sink writes unpartitioned tables only"
        )));
    }
    let schema = iceberg::arrow::schema_to_arrow_schema(metadata.current_schema())
        .map_err(|e| ConnectorError::Config(format!("{what}: {}", e.message())))?;
    if let Some(reason) = schema.fields().iter().find_map(|f| iceberg_rows::unsupported(f)) {
        return Err(ConnectorError::Config(format!("{what}: {reason}")));
    }
    Ok(Arc::new(schema))
}

#[async_trait]
impl super::Open for NessieSink {
    async fn open(config: &NessieConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let nessie = Nessie::connect(config, ctx).await?;
        create_missing(&nessie, config).await?;
        let table = nessie.load().await?;
        let schema = writable_schema(&table, &nessie.target)?;
        let raw = schema.fields().len() == 1 && schema.field(0).name() == "data";
        let position = PositionProperty::of(ctx, &nessie.target);
        Ok(Self {
            nessie,
            raw,
            exactly_once: config.exactly_once,
            positions_key: ctx.positions_key.clone(),
            position,
            file_prefix: format!("sless-{}", sless_runtime::hex::encode(&rand::random::<[u8; 8]>())),
            files: AtomicU64::new(0),
        })
    }

    async fn release(config: &NessieConfig, ctx: &PipelineContext) -> Result<(), ConnectorError> {
        let nessie = Nessie::connect(config, ctx).await?;
        // Nothing to remove from a table that is gone.
        if !nessie
            .catalog
            .table_exists(&nessie.ident)
            .await
            .map_err(|e| catalog_error(&e, &nessie.target))?
        {
            return Ok(());
        }
        let table = nessie.load().await?;
        let position = PositionProperty::of(ctx, &nessie.target);
        if !table.metadata().properties().contains_key(&position.name) {
            return Ok(());
        }
        let transaction = Transaction::new(&table);
        let transaction = transaction
            .update_table_properties()
            .remove(position.name)
            .apply(transaction)
            .map_err(|e| catalog_error(&e, &nessie.target))?;
        transaction
            .commit(&nessie.catalog)
            .await
            .map(drop)
            .map_err(|e| catalog_error(&e, &nessie.target))
    }
}

impl NessieSink {
    /// The rows of `messages` as a batch of the table's current schema.
    fn batch(
        &self,
        schema: &SchemaRef,
        uuids: &[String],
        messages: &[Message],
    ) -> Result<arrow_array::RecordBatch, ConnectorError> {
        let wrapped: Vec<Map<String, Value>>;
        let rows: Vec<&Map<String, Value>> = if self.raw {
            wrapped = messages
                .iter()
                .map(|m| Map::from_iter([("data".to_owned(), Value::String(m.data.to_string()))]))
                .collect();
            wrapped.iter().collect()
        } else {
            messages
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    m.data
                        .as_object()
                        .ok_or_else(|| ConnectorError::Data(format!("message {i} is not a JSON object")))
                })
                .collect::<Result<_, _>>()?
        };
        iceberg_rows::to_batch(schema, uuids, &rows).map_err(ConnectorError::Data)
    }

    /// Writes `messages` as one Parquet data file of `table`.
    async fn data_files(
        &self,
        table: &Table,
        messages: &[Message],
    ) -> Result<Vec<iceberg::spec::DataFile>, ConnectorError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let what = &self.nessie.target;
        let schema = writable_schema(table, what)?;
        let metadata = table.metadata();
        let uuids = iceberg_rows::uuid_columns(metadata.current_schema());
        let batch = self.batch(&schema, &uuids, messages)?;
        let n = self.files.fetch_add(1, Ordering::Relaxed);
        let files = RollingFileWriterBuilder::new(
            ParquetWriterBuilder::new(WriterProperties::default(), metadata.current_schema().clone()),
            TARGET_FILE_BYTES,
            table.file_io().clone(),
            DefaultLocationGenerator::new(metadata).map_err(|e| catalog_error(&e, what))?,
            DefaultFileNameGenerator::new(format!("{}-{n}", self.file_prefix), None, DataFileFormat::Parquet),
        );
        let store =
            |e: iceberg::Error| ConnectorError::Transient(format!("{what}: writing a data file: {}", e.message()));
        let mut writer = DataFileWriterBuilder::new(files).build(None).await.map_err(store)?;
        writer.write(batch).await.map_err(store)?;
        writer.close().await.map_err(store)
    }
}

fn no_positions_key() -> ConnectorError {
    ConnectorError::Config(
        "exactlyOnce seals the positions it stores with the tenant's key, which this processor was \
         not given (--positions-key-file); set exactlyOnce to false"
            .into(),
    )
}

#[async_trait]
impl Sink for NessieSink {
    fn target(&self) -> &str {
        &self.nessie.target
    }

    async fn write(&self, messages: &[Message]) -> Result<(), ConnectorError> {
        self.write_at(messages, None).await
    }

    fn exactly_once(&self) -> Option<bool> {
        self.exactly_once
    }

    async fn stored_position(&self) -> Result<Option<String>, ConnectorError> {
        let key = self.positions_key.as_ref().ok_or_else(no_positions_key)?;
        let table = self.nessie.load().await?;
        self.position
            .verified(&table, key)
            .map_err(|e| ConnectorError::Config(format!("{}: {e}", self.nessie.target)))
    }

    async fn write_at(&self, messages: &[Message], position: Option<&str>) -> Result<(), ConnectorError> {
        let what = &self.nessie.target;
        let mut table = self.nessie.load().await?;
        let stored = match position {
            // Sent again after a lost answer, and the first commit landed:
            // no data file to write.
            Some(position) if self.position.read(&table).as_deref() == Some(position) => return Ok(()),
            Some(position) => {
                let key = self.positions_key.as_ref().ok_or_else(no_positions_key)?;
                Some((position, self.position.value(position, key)))
            }
            None => None,
        };
        let files = self.data_files(&table, messages).await?;
        if files.is_empty() && stored.is_none() {
            return Ok(());
        }
        let guarded = Guarded {
            catalog: &self.nessie.catalog,
            position: stored.as_ref().map(|(position, _)| (&self.position, *position)),
        };
        for attempt in 1..=COMMIT_ATTEMPTS {
            let mut transaction = Transaction::new(&table);
            if let Some((_, value)) = &stored {
                transaction = transaction
                    .update_table_properties()
                    .set(self.position.name.clone(), value.clone())
                    .apply(transaction)
                    .map_err(|e| catalog_error(&e, what))?;
            }
            if !files.is_empty() {
                transaction = transaction
                    .fast_append()
                    .with_check_duplicate(false)
                    .add_data_files(files.clone())
                    .apply(transaction)
                    .map_err(|e| catalog_error(&e, what))?;
            }
            match transaction.commit(&guarded).await {
                Ok(_) => return Ok(()),
                // A commit sent again whose first answer was lost, found in the table.
                Err(e) if Guarded::committed_already(&e) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::CatalogCommitConflicts && attempt < COMMIT_ATTEMPTS => {
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                    table = self.nessie.load().await?;
                }
                Err(e) => return Err(catalog_error(&e, what)),
            }
        }
        Err(ConnectorError::Transient(format!(
            "{what}: other writers committed first {COMMIT_ATTEMPTS} times"
        )))
    }
}
