//! A replica's Raft log: one append-only file of records,
//! `[payload length: u32 LE][CRC-32 of the payload: u32 LE][payload]`, a
//! payload being the JSON of a log entry, or of the point up to which the
//! log was purged. It is read back up to its first invalid record: records
//! are synced together, so what follows a torn one was not synced either,
//! and none of it was acknowledged. The vote is a file of its own, replaced
//! whole.
//!
//! An append is written at once and readable when it returns; it counts as
//! held once the syncing thread has synced it (`disk` durability), or once
//! written, in the kernel's page cache, with a sync at most
//! [`PROCESS_SYNC_MS`] later (`process`). That thread syncs once for every
//! append that waited meanwhile (group commit). Once purged records
//! outweigh the live ones, the live ones are copied into a new file.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::ops::RangeBounds;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, ErrorSubject, ErrorVerb, LogId, StorageError, StorageIOError, Vote};
use serde::{Deserialize, Serialize};
use sless_model::queue_service::{Durability, PROCESS_SYNC_MS};
use sless_runtime::sync::Unpoisoned;

use super::{Failure, NodeId, TypeConfig};
use crate::engine::journal::log::{HEADER, next_header, seal, sync_dir, whole_record};
use crate::engine::journal::sibling;

const MAGIC: &[u8; 8] = b"SLESSRL1";
/// Purged bytes below this never trigger a rewrite.
const REWRITE_MIN: u64 = 16 << 20;

#[derive(Serialize, Deserialize)]
enum Record {
    Entry(Entry<TypeConfig>),
    Purged(LogId<NodeId>),
}

type Error = StorageError<NodeId>;

fn io_error(subject: ErrorSubject<NodeId>, verb: ErrorVerb, e: io::Error) -> Error {
    StorageError::from_io_error(subject, verb, e)
}

fn log_error(verb: ErrorVerb) -> impl FnOnce(io::Error) -> Error {
    move |e| io_error(ErrorSubject::Logs, verb, e)
}

/// Where an entry's record lies in the file.
#[derive(Clone, Copy)]
struct Span {
    at: u64,
    len: u64,
    log_id: LogId<NodeId>,
}

struct Inner {
    path: PathBuf,
    file: Arc<File>,
    end: u64,
    entries: BTreeMap<u64, Span>,
    last_purged: Option<LogId<NodeId>>,
    /// Bytes of the file that purged entries still take.
    purged_bytes: u64,
    vote: Option<Vote<NodeId>>,
}

/// A replica's log. Clones share it (the reader openraft asks for is one).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
    syncs: mpsc::Sender<Sync>,
    probe: Arc<Probe>,
}

/// What the syncing thread and tests tell a log.
#[derive(Default)]
pub struct Probe {
    /// Makes every append fail while set: a sync failed, so what the file
    /// holds is unknown (or a test injects write failures).
    pub failing: AtomicBool,
    /// Syncs that reached the disk.
    pub syncs: AtomicU64,
}

/// A sync for the syncing thread: the file, and who waits for it.
type Sync = (Arc<File>, Option<LogFlushed<TypeConfig>>);

impl LogStore {
    /// Opens (or creates) the log at `dir/raft.log`, cutting off a torn
    /// last record. It keeps `lock` (the replica's) until it is closed.
    pub fn open(dir: &Path, durability: Durability, lock: File, probe: Arc<Probe>) -> Result<Self, Error> {
        std::fs::create_dir_all(dir).map_err(log_error(ErrorVerb::Write))?;
        let path = dir.join("raft.log");
        if !path.exists() {
            let tmp = sibling(&path, "-new");
            std::fs::write(&tmp, MAGIC).map_err(log_error(ErrorVerb::Write))?;
            File::open(&tmp)
                .and_then(|f| f.sync_all())
                .and_then(|()| std::fs::rename(&tmp, &path))
                .and_then(|()| sync_dir(&path))
                .map_err(log_error(ErrorVerb::Write))?;
        }
        let inner = read(&path)?;
        let vote = read_vote(dir)?;
        let (syncs, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("raft-log-sync".into())
            .spawn({
                let probe = probe.clone();
                move || {
                    syncer(&rx, durability, &probe);
                    drop(lock);
                }
            })
            .map_err(log_error(ErrorVerb::Write))?;
        Ok(Self {
            inner: Arc::new(Mutex::new(Inner { vote, ..inner })),
            syncs,
            probe,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock_unpoisoned()
    }

    /// The bytes of the entries after `index` (all, without one).
    pub fn bytes_after(&self, index: Option<u64>) -> u64 {
        let from = index.map_or(0, |i| i + 1);
        self.lock().entries.range(from..).map(|(_, s)| s.len).sum()
    }
}

/// Reads the log file at `path`: where each entry lies, and the purge point.
fn read(path: &Path) -> Result<Inner, Error> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(log_error(ErrorVerb::Read))?;
    let size = file.metadata().map_err(log_error(ErrorVerb::Read))?.len();
    let mut reader = BufReader::new(&file);
    let mut magic = [0; 8];
    if reader.read_exact(&mut magic).is_err() || &magic != MAGIC {
        return Err(StorageIOError::read_logs(&Failure(format!("{} is not a Raft log", path.display()))).into());
    }
    let mut inner = Inner {
        path: path.to_owned(),
        file: Arc::new(file.try_clone().map_err(log_error(ErrorVerb::Read))?),
        end: MAGIC.len() as u64,
        entries: BTreeMap::new(),
        last_purged: None,
        purged_bytes: 0,
        vote: None,
    };
    let mut payload = Vec::new();
    while let Some((len, crc)) = next_header(&mut reader, size - inner.end).map_err(log_error(ErrorVerb::Read))? {
        payload.resize(len, 0);
        reader.read_exact(&mut payload).map_err(log_error(ErrorVerb::Read))?;
        if crc32fast::hash(&payload) != crc {
            break;
        }
        let at = inner.end;
        inner.end += (HEADER + len) as u64;
        match serde_json::from_slice(&payload).map_err(|e| StorageIOError::read_logs(&e))? {
            Record::Entry(e) => {
                let span = Span {
                    at,
                    len: inner.end - at,
                    log_id: e.log_id,
                };
                inner.entries.insert(e.log_id.index, span);
            }
            Record::Purged(upto) => inner.purge(upto),
        }
    }
    drop(reader);
    if inner.end < size {
        let mut tail = vec![0; usize::try_from(size - inner.end).unwrap_or(usize::MAX)];
        file.read_exact_at(&mut tail, inner.end)
            .map_err(log_error(ErrorVerb::Read))?;
        // Entries are written a record each and synced together, so a
        // crash can leave valid records after a torn one: none of them was
        // acknowledged by this replica (the leader sends them again).
        if whole_record(&tail).is_some() || tail.iter().any(|b| *b != 0) {
            let cut = size - inner.end;
            tracing::warn!(log = %path.display(), at = inner.end, cut, "cut off the Raft log's unsynced last writes");
        }
        file.set_len(inner.end).map_err(log_error(ErrorVerb::Write))?;
        file.sync_all().map_err(log_error(ErrorVerb::Write))?;
    }
    Ok(inner)
}

impl Inner {
    fn purge(&mut self, upto: LogId<NodeId>) {
        let kept = self.entries.split_off(&(upto.index + 1));
        self.purged_bytes += self.entries.values().map(|s| s.len).sum::<u64>();
        self.entries = kept;
        self.last_purged = Some(upto);
    }

    /// Appends one record of `record` at the end of the file.
    fn write(&mut self, record: &Record) -> Result<Span, io::Error> {
        let mut buf = vec![0; HEADER];
        serde_json::to_writer(&mut buf, record).map_err(io::Error::other)?;
        seal(&mut buf).map_err(io::Error::other)?;
        let at = self.end;
        if let Err(e) = self.file.write_all_at(&buf, at) {
            // A partial record would read as damage once a later one follows.
            let _ = self.file.set_len(at);
            return Err(e);
        }
        self.end += buf.len() as u64;
        let log_id = match record {
            Record::Entry(e) => e.log_id,
            Record::Purged(id) => *id,
        };
        Ok(Span {
            at,
            len: buf.len() as u64,
            log_id,
        })
    }

    fn entry(&self, span: &Span) -> Result<Entry<TypeConfig>, Error> {
        let mut buf = vec![0; usize::try_from(span.len).unwrap_or(usize::MAX)];
        self.file
            .read_exact_at(&mut buf, span.at)
            .map_err(|e| io_error(ErrorSubject::Log(span.log_id), ErrorVerb::Read, e))?;
        match serde_json::from_slice(&buf[HEADER..]) {
            Ok(Record::Entry(e)) => Ok(e),
            Ok(Record::Purged(_)) => {
                Err(StorageIOError::read_log_entry(span.log_id, &Failure("not an entry".into())).into())
            }
            Err(e) => Err(StorageIOError::read_log_entry(span.log_id, &e).into()),
        }
    }

    /// Copies the live entries into a new file once purged ones outweigh
    /// them, and renames it over the log.
    fn rewrite_if_due(&mut self) -> Result<(), io::Error> {
        let live: u64 = self.entries.values().map(|s| s.len).sum();
        if self.purged_bytes < REWRITE_MIN.max(live) {
            return Ok(());
        }
        let tmp = sibling(&self.path, "-new");
        let mut out = Inner {
            path: tmp.clone(),
            file: Arc::new(
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&tmp)?,
            ),
            end: 0,
            entries: BTreeMap::new(),
            last_purged: self.last_purged,
            purged_bytes: 0,
            vote: None,
        };
        out.file.write_all_at(MAGIC, 0)?;
        out.end = MAGIC.len() as u64;
        if let Some(upto) = self.last_purged {
            out.write(&Record::Purged(upto))?;
        }
        for span in self.entries.values() {
            let mut buf = vec![0; usize::try_from(span.len).map_err(io::Error::other)?];
            self.file.read_exact_at(&mut buf, span.at)?;
            let at = out.end;
            out.file.write_all_at(&buf, at)?;
            out.end += span.len;
            out.entries.insert(span.log_id.index, Span { at, ..*span });
        }
        out.file.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        sync_dir(&self.path)?;
        self.file = out.file;
        self.end = out.end;
        self.entries = out.entries;
        self.purged_bytes = 0;
        Ok(())
    }
}

/// Syncs the log for every append that waits (group commit); with
/// `process` durability they waited for nothing, and it syncs on a timer.
fn syncer(rx: &mpsc::Receiver<Sync>, durability: Durability, probe: &Probe) {
    let every = Duration::from_millis(PROCESS_SYNC_MS);
    // With `process` durability: since when answered appends wait for a sync.
    let mut unsynced: Option<(Instant, Vec<Arc<File>>)> = None;
    loop {
        let first = match &unsynced {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some((since, _)) => rx.recv_timeout((*since + every).saturating_duration_since(Instant::now())),
        };
        let batch: Vec<Sync> = match first {
            Ok(first) => std::iter::once(first).chain(rx.try_iter()).collect(),
            Err(RecvTimeoutError::Timeout) => Vec::new(),
            Err(RecvTimeoutError::Disconnected) => break,
        };
        if durability == Durability::Process {
            let (since, files) = unsynced.get_or_insert_with(|| (Instant::now(), Vec::new()));
            for (file, flushed) in batch {
                files.push(file);
                if let Some(flushed) = flushed {
                    flushed.log_io_completed(Ok(()));
                }
            }
            if since.elapsed() >= every
                && let Some((_, files)) = unsynced.take()
            {
                // Already answered: a failure is only logged.
                let _ = sync_all(files, probe);
            }
            continue;
        }
        let files = batch.iter().map(|(f, _)| f.clone()).collect();
        let synced = sync_all(files, probe);
        for (_, flushed) in batch {
            if let Some(flushed) = flushed {
                let result = synced.as_ref().map_err(|e| io::Error::new(e.kind(), e.to_string()));
                flushed.log_io_completed(result.copied());
            }
        }
    }
    if let Some((_, files)) = unsynced {
        let _ = sync_all(files, probe);
    }
}

/// Syncs each of `files` once.
fn sync_all(mut files: Vec<Arc<File>>, probe: &Probe) -> io::Result<()> {
    files.dedup_by(|a, b| Arc::ptr_eq(a, b));
    let synced = files.iter().try_for_each(|f| f.sync_data());
    match &synced {
        Ok(()) => drop(probe.syncs.fetch_add(1, Ordering::SeqCst)),
        Err(e) => {
            tracing::error!(error = %e, "syncing the Raft log failed; the replica takes no more writes");
            probe.failing.store(true, Ordering::SeqCst);
        }
    }
    synced
}

fn read_vote(dir: &Path) -> Result<Option<Vote<NodeId>>, Error> {
    match std::fs::read(dir.join("raft.vote")) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StorageIOError::read_vote(&e).into()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error(ErrorSubject::Vote, ErrorVerb::Read, e)),
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, Error> {
        let inner = self.lock();
        inner.entries.range(range).map(|(_, span)| inner.entry(span)).collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, Error> {
        let inner = self.lock();
        let last = inner
            .entries
            .values()
            .next_back()
            .map(|s| s.log_id)
            .or(inner.last_purged);
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), Error> {
        let mut inner = self.lock();
        let path = inner.path.with_file_name("raft.vote");
        let tmp = sibling(&path, "-new");
        let bytes = serde_json::to_vec(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        std::fs::write(&tmp, bytes)
            .and_then(|()| File::open(&tmp)?.sync_all())
            .and_then(|()| std::fs::rename(&tmp, &path))
            .and_then(|()| sync_dir(&path))
            .map_err(|e| io_error(ErrorSubject::Vote, ErrorVerb::Write, e))?;
        inner.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, Error> {
        Ok(self.lock().vote)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), Error>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        if self.probe.failing.load(Ordering::SeqCst) {
            let failed = io::Error::other("a write or sync of the log failed before");
            return Err(io_error(ErrorSubject::Logs, ErrorVerb::Write, failed));
        }
        let file = {
            let mut inner = self.lock();
            for entry in entries {
                let index = entry.log_id.index;
                let span = inner
                    .write(&Record::Entry(entry))
                    .map_err(log_error(ErrorVerb::Write))?;
                inner.entries.insert(index, span);
            }
            inner.file.clone()
        };
        // A stopped syncer drops the callback, which openraft takes as a failure.
        let _ = self.syncs.send((file, Some(callback)));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), Error> {
        let mut inner = self.lock();
        let cut = inner.entries.split_off(&log_id.index);
        if let Some(first) = cut.values().next() {
            let at = first.at;
            inner.file.set_len(at).map_err(log_error(ErrorVerb::Delete))?;
            inner.file.sync_data().map_err(log_error(ErrorVerb::Delete))?;
            inner.end = at;
        }
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), Error> {
        let mut inner = self.lock();
        inner.purge(log_id);
        // Not synced: a purge forgotten by a crash leaves entries that the
        // snapshot covers, which are read again harmlessly.
        inner
            .write(&Record::Purged(log_id))
            .map_err(log_error(ErrorVerb::Delete))?;
        // A rewrite that failed (a full disk) is tried again at the next purge.
        if let Err(e) = inner.rewrite_if_due() {
            tracing::warn!(error = %e, "rewriting the Raft log without its purged entries failed");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorageExt;
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;

    fn entry(index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    async fn indexes(store: &mut LogStore) -> Vec<u64> {
        store
            .try_get_log_entries(0..)
            .await
            .unwrap()
            .iter()
            .map(|e| e.log_id.index)
            .collect()
    }

    #[tokio::test]
    async fn truncation_purges_and_a_torn_tail_survive_a_reopening() {
        let dir = std::env::temp_dir().join(format!("sless-raftlog-{}", rand::random::<u64>()));
        let open = || {
            let lock = crate::engine::journal::lock(&dir.join("raft")).unwrap();
            LogStore::open(&dir, Durability::Disk, lock, Arc::default()).unwrap()
        };
        std::fs::create_dir_all(&dir).unwrap();
        let mut store = open();
        store.blocking_append((1..=10).map(entry)).await.unwrap();
        store.truncate(entry(7).log_id).await.unwrap();
        store.purge(entry(3).log_id).await.unwrap();
        store.blocking_append([entry(7)]).await.unwrap();
        drop(store);
        // A crash tore a write after the last record.
        let path = dir.join("raft.log");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[9, 0, 0, 0, 1, 2, 3]);
        std::fs::write(&path, &bytes).unwrap();

        let mut store = open();
        assert_eq!(indexes(&mut store).await, [4, 5, 6, 7]);
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(3));
        assert_eq!(state.last_log_id.map(|l| l.index), Some(7));
        assert_eq!(
            std::fs::metadata(&path).unwrap().len() as usize,
            bytes.len() - 7,
            "the torn write is cut off"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
