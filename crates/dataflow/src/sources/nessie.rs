//! Nessie source: polls an Iceberg table of a Nessie branch for data files
//! committed after the read position and reads only those: each data file
//! carries the sequence number of the commit that added it (Iceberg format
//! 2), so the files of the current snapshot's manifests with a higher one
//! are the new ones, however many commits came between two polls (Nessie
//! keeps only a table's current snapshot in its metadata, so there is no
//! snapshot history to walk). Files are read by sequence number, then path;
//! rows in file order; manifests older than the position are not opened.
//! The read position is a file (its sequence number and path) and how many
//! of its rows are read: it is the checkpoint (and what an exactly-once sink
//! stores), so the source resumes inside a file without reading its rows
//! again. A table whose history went back before the position (a branch
//! reset, a rollback) stops the flow with that reason.
//!
//! What a commit adds is read: appends, and the files an update, a merge or
//! a compaction rewrites (their rows again). Delete files are not applied,
//! so rows deleted after they were appended are still read once.

use async_trait::async_trait;
use futures_util::TryStreamExt;
use iceberg::scan::FileScanTask;
use iceberg::spec::{FormatVersion, ManifestContentType, ManifestStatus};
use iceberg::table::Table;
use serde_json::Value;

use super::polling::{Polling, RowPosition};
use super::{DEFAULT_BATCH, Record, Source};
use crate::ConnectorError;
use crate::component::Component;
use crate::context::PipelineContext;
use crate::iceberg_rows;
use crate::nessie_client::{Nessie, NessieConfig, catalog_error};
use sless_model::ValidationErrors;
use sless_model::dataflow::Role;

pub struct NessieSource {
    nessie: Nessie,
    batch: usize,
    polling: Polling,
    /// The read of the file the last batch ended in, kept for the next.
    cursor: tokio::sync::Mutex<Option<Cursor>>,
}

/// An open read of one data file, kept between batches: the next batch of a
/// large file goes on where the last one stopped instead of reading the
/// file from its start again.
struct Cursor {
    sequence: i64,
    path: String,
    /// The row of the file `pending`'s first row (or the stream's next) is.
    next: u64,
    /// Rows of the last record batch not handed out yet.
    pending: Option<arrow_array::RecordBatch>,
    batches: iceberg::scan::ArrowRecordBatchStream,
}

impl Component for NessieSource {
    const KIND: &'static str = "nessie";
    type Config = NessieConfig;

    fn check(c: &NessieConfig, path: &str, errors: &mut ValidationErrors) {
        c.check(Role::Source, path, errors);
    }
}

#[async_trait]
impl super::Open for NessieSource {
    const RESUMABLE: bool = true;

    async fn open(config: &NessieConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let nessie = Nessie::connect(config, ctx).await?;
        let table = nessie.load().await?;
        if table.metadata().format_version() == FormatVersion::V1 {
            return Err(ConnectorError::Config(format!(
                "{}: an Iceberg format 1 table has no sequence numbers to read new rows by; \
                 upgrade it to format 2",
                nessie.target
            )));
        }
        let schema = iceberg::arrow::schema_to_arrow_schema(table.metadata().current_schema())
            .map_err(|e| ConnectorError::Config(format!("{}: {}", nessie.target, e.message())))?;
        if let Some(reason) = schema.fields().iter().find_map(|f| iceberg_rows::unsupported(f)) {
            return Err(ConnectorError::Config(format!("{}: {reason}", nessie.target)));
        }
        Ok(Self {
            nessie,
            batch: config
                .batch_size
                .unwrap_or(DEFAULT_BATCH as u32)
                .clamp(1, crate::nessie_client::MAX_BATCH) as usize,
            polling: Polling::start(config.poll_interval, ctx).await?,
            cursor: tokio::sync::Mutex::new(None),
        })
    }
}

/// A data file of the table, with the sequence number of its commit.
struct Added {
    sequence: i64,
    task: FileScanTask,
    rows: u64,
}

/// Where reading resumes: every file before `path` in the order files
/// are read (by sequence number, then path) is read, and `rows` rows of
/// `path`. Kept by file, not by count, so a file of the same commit that is
/// rewritten or removed later does not move it.
#[derive(Clone, PartialEq, Eq, Debug)]
struct After {
    sequence: i64,
    path: String,
    rows: u64,
}

impl After {
    fn parse(position: &RowPosition) -> Result<Self, ConnectorError> {
        let bad = || ConnectorError::Config(format!("{:?} is not a nessie read position", position.text()));
        let (rows, path) = position
            .id
            .as_deref()
            .and_then(|id| id.split_once('/'))
            .ok_or_else(bad)?;
        Ok(Self {
            sequence: position.value.parse().map_err(|_| bad())?,
            path: path.to_owned(),
            rows: rows.parse().map_err(|_| bad())?,
        })
    }

    fn position(&self) -> RowPosition {
        RowPosition {
            value: self.sequence.to_string(),
            id: Some(format!("{}/{}", self.rows, self.path)),
        }
    }
}

impl NessieSource {
    /// The data files of the table's current snapshot committed at or after
    /// `after`'s sequence number, by sequence number and path.
    async fn files_from(&self, table: &Table, after: Option<&After>) -> Result<Vec<Added>, ConnectorError> {
        let what = &self.nessie.target;
        let Some(snapshot) = table.metadata().current_snapshot() else {
            return Ok(Vec::new());
        };
        let from = after.map_or(i64::MIN, |a| a.sequence);
        let list = table
            .manifest_list_reader(snapshot)
            .load()
            .await
            .map_err(|e| catalog_error(&e, what))?;
        let schema = table.metadata().current_schema().clone();
        let fields: Vec<i32> = schema.as_struct().fields().iter().map(|f| f.id).collect();
        let mut files = Vec::new();
        for manifest in list.entries() {
            // A manifest holds files of its own commit's sequence number or older.
            if manifest.content != ManifestContentType::Data || manifest.sequence_number < from {
                continue;
            }
            let entries = manifest
                .load_manifest(table.file_io())
                .await
                .map_err(|e| catalog_error(&e, what))?;
            for entry in entries.entries() {
                let sequence = entry.sequence_number().unwrap_or(manifest.sequence_number);
                if entry.status() == ManifestStatus::Deleted || sequence < from {
                    continue;
                }
                let task = FileScanTask::builder()
                    .with_file_size_in_bytes(entry.file_size_in_bytes())
                    .with_start(0)
                    .with_length(entry.file_size_in_bytes())
                    .with_record_count(Some(entry.record_count()))
                    .with_data_file_path(entry.file_path().to_owned())
                    .with_data_file_format(entry.file_format())
                    .with_schema(schema.clone())
                    .with_project_field_ids(fields.clone())
                    .with_case_sensitive(true)
                    .build();
                files.push(Added {
                    sequence,
                    task,
                    rows: entry.record_count(),
                });
            }
        }
        files.sort_by(|a, b| (a.sequence, &a.task.data_file_path).cmp(&(b.sequence, &b.task.data_file_path)));
        Ok(files)
    }

    /// The rows of `file` from its `skip`th on, at most `take`: on from the
    /// kept read of it where that stopped at `skip`, else from a new one.
    async fn rows_of(&self, table: &Table, file: Added, skip: u64, take: usize) -> Result<Vec<Value>, ConnectorError> {
        let what = &self.nessie.target;
        // Taken out while read: a read cancelled midway leaves none to reuse.
        let mut slot = self.cursor.lock().await;
        let kept = slot
            .take()
            .filter(|c| c.sequence == file.sequence && c.path == file.task.data_file_path && c.next == skip);
        let mut cursor = match kept {
            Some(cursor) => cursor,
            None => Cursor {
                sequence: file.sequence,
                path: file.task.data_file_path.clone(),
                next: 0,
                pending: None,
                batches: table
                    .reader_builder()
                    .with_batch_size(take.clamp(1, 8192))
                    .build()
                    .read(Box::pin(futures_util::stream::iter([Ok(file.task)])))
                    .map_err(|e| catalog_error(&e, what))?
                    .stream(),
            },
        };
        let uuids = iceberg_rows::uuid_columns(table.metadata().current_schema());
        let mut rows = Vec::new();
        while rows.len() < take {
            let batch = match cursor.pending.take() {
                Some(batch) => batch,
                None => match cursor.batches.try_next().await.map_err(|e| catalog_error(&e, what))? {
                    Some(batch) => batch,
                    None => break,
                },
            };
            let before = skip.saturating_sub(cursor.next).min(batch.num_rows() as u64) as usize;
            cursor.next += before as u64;
            let batch = batch.slice(before, batch.num_rows() - before);
            let used = batch.num_rows().min(take - rows.len());
            let objects = iceberg_rows::from_batch(&batch.slice(0, used), &uuids)
                .map_err(|e| ConnectorError::Config(format!("{what}: {e}")))?;
            rows.extend(objects.into_iter().map(Value::Object));
            cursor.next += used as u64;
            if used < batch.num_rows() {
                cursor.pending = Some(batch.slice(used, batch.num_rows() - used));
            }
        }
        *slot = Some(cursor);
        Ok(rows)
    }

    async fn read_after(&self, position: Option<RowPosition>) -> Result<Vec<(Record, RowPosition)>, ConnectorError> {
        let after = position.as_ref().map(After::parse).transpose()?;
        let table = self.nessie.load().await?;
        if let Some(after) = &after
            && table.metadata().last_sequence_number() < after.sequence
        {
            return Err(ConnectorError::Config(format!(
                "{}: the table's history went back before the read position (commit {}): a branch reset or a \
                 rollback; read it from the start again by deleting the dataflow's checkpoint",
                self.nessie.target, after.sequence
            )));
        }
        let mut read = Vec::new();
        for file in self.files_from(&table, after.as_ref()).await? {
            let skip = match &after {
                Some(a) if (file.sequence, &file.task.data_file_path) < (a.sequence, &a.path) => continue,
                Some(a) if (file.sequence, &file.task.data_file_path) == (a.sequence, &a.path) => a.rows,
                _ => 0,
            };
            if skip >= file.rows {
                continue;
            }
            let (sequence, path) = (file.sequence, file.task.data_file_path.clone());
            let rows = self.rows_of(&table, file, skip, self.batch - read.len()).await?;
            for (row, data) in (skip + 1..).zip(rows) {
                let at = After {
                    sequence,
                    path: path.clone(),
                    rows: row,
                };
                read.push(at.position().record(data));
            }
            if read.len() >= self.batch {
                break;
            }
        }
        Ok(read)
    }
}

#[async_trait]
impl Source for NessieSource {
    fn batch_size(&self) -> usize {
        self.batch
    }

    async fn read(&self) -> Result<Vec<Record>, ConnectorError> {
        self.polling.read(|after| self.read_after(after)).await
    }

    async fn commit(&self, done: &[super::Position]) -> Result<(), ConnectorError> {
        self.polling.commit(done).await
    }

    fn resume_text(&self, done: &[super::Position]) -> Option<String> {
        super::polling::resume_text(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_position_round_trips_and_refuses_what_is_not_one() {
        let at = After {
            sequence: 42,
            path: "s3://b/t/data/00000-0-a.parquet".into(),
            rows: 7,
        };
        assert_eq!(After::parse(&RowPosition::parse(&at.position().text())).unwrap(), at);
        assert!(
            After::parse(&RowPosition::parse("17")).is_err(),
            "a row position of another source"
        );
    }
}
