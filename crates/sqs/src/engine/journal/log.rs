//! The journal's file: an append-only log. It starts with [`MAGIC`]; each
//! record after it is one group commit,
//! `[payload length: u32 LE][CRC-32 of the payload: u32 LE][payload]`, and a
//! payload is one entry per change,
//! `[tag: u8][queue name length: u16 LE][queue name][seq: u64 LE][value length: u32 LE][value]`,
//! the value being the JSON of a queue or a message (empty for deletions).
//!
//! A record is written with one `write` into preallocated zeros and made
//! durable with one `fdatasync`, so a crash can tear only the last record,
//! which no request was answered for: the log ends at the first invalid
//! record, and opening cuts the rest off. A whole valid record after an
//! invalid one means damage, not a torn write, and opening refuses it rather
//! than drop what follows. The log remembers where each live entry lies; once
//! dead entries outweigh the live ones (and [`COMPACT_MIN`]), it copies the
//! live entries into a new file and renames that over the old one.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{Change, sibling};
use crate::engine::records::{StoredMessage, StoredQueue};

/// The first bytes of every journal file (and its format's version).
const MAGIC: &[u8; 8] = b"SLESSQJ1";
/// Bytes before each record's payload: its length and CRC.
const HEADER: usize = 8;
/// Dead bytes below this never trigger a compaction.
const COMPACT_MIN: u64 = 16 << 20;
/// The file grows by this much at a time, in zeros (see [`Log::preallocate`]).
const PREALLOCATE: u64 = 4 << 20;
/// A compaction (or a migration) writes records of about this size.
const COPY_RECORD: usize = 1 << 20;

const PUT_QUEUE: u8 = 1;
const DELETE_QUEUE: u8 = 2;
const PURGE_QUEUE: u8 = 3;
const PUT_MESSAGE: u8 = 4;
const DELETE_MESSAGE: u8 = 5;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0} is not a queue journal")]
    NotAJournal(PathBuf),
    #[error("{path} is damaged at byte {at}: {what}")]
    Damaged { path: PathBuf, at: u64, what: String },
    #[error("a change cannot be journaled: {0}")]
    Unencodable(String),
    #[error("the journal failed earlier and takes no more writes until the engine restarts: {0}")]
    Poisoned(String),
}

/// Where an entry lies in the file.
#[derive(Debug, Clone, Copy)]
struct Span {
    at: u64,
    len: u32,
}

/// What a value of the tables occupies in the file.
trait Placed {
    fn span(&self) -> Span;
}

impl Placed for Span {
    fn span(&self) -> Span {
        *self
    }
}

impl<T> Placed for (Span, T) {
    fn span(&self) -> Span {
        self.0
    }
}

/// The live queues and messages, as the log's entries leave them; `bytes`
/// is the size of their entries. The writer keeps spans; opening also keeps
/// the decoded records.
struct Tables<Q, M> {
    queues: HashMap<String, Q>,
    messages: HashMap<String, BTreeMap<u64, M>>,
    bytes: u64,
}

impl<Q: Placed, M: Placed> Tables<Q, M> {
    fn new() -> Self {
        Self {
            queues: HashMap::new(),
            messages: HashMap::new(),
            bytes: 0,
        }
    }

    fn put_queue(&mut self, name: &str, value: Q) {
        self.bytes += u64::from(value.span().len);
        if let Some(old) = self.queues.insert(name.to_owned(), value) {
            self.bytes -= u64::from(old.span().len);
        }
    }

    fn delete_queue(&mut self, name: &str) {
        if let Some(old) = self.queues.remove(name) {
            self.bytes -= u64::from(old.span().len);
        }
        self.purge_queue(name);
    }

    fn purge_queue(&mut self, name: &str) {
        if let Some(old) = self.messages.remove(name) {
            self.bytes -= old.values().map(|m| u64::from(m.span().len)).sum::<u64>();
        }
    }

    fn put_message(&mut self, queue: &str, seq: u64, value: M) {
        self.bytes += u64::from(value.span().len);
        let messages = match self.messages.get_mut(queue) {
            Some(messages) => messages,
            None => self.messages.entry(queue.to_owned()).or_default(),
        };
        if let Some(old) = messages.insert(seq, value) {
            self.bytes -= u64::from(old.span().len);
        }
    }

    fn delete_message(&mut self, queue: &str, seq: u64) {
        if let Some(messages) = self.messages.get_mut(queue) {
            if let Some(old) = messages.remove(&seq) {
                self.bytes -= u64::from(old.span().len);
            }
            if messages.is_empty() {
                self.messages.remove(queue);
            }
        }
    }

    /// Applies entry `e`; a put keeps the value `queue` or `message` makes.
    fn apply(
        &mut self,
        e: &Entry<'_>,
        queue: impl FnOnce() -> Result<Q, String>,
        message: impl FnOnce() -> Result<M, String>,
    ) -> Result<(), String> {
        match e.tag {
            PUT_QUEUE => self.put_queue(e.queue, queue()?),
            DELETE_QUEUE => self.delete_queue(e.queue),
            PURGE_QUEUE => self.purge_queue(e.queue),
            PUT_MESSAGE => self.put_message(e.queue, e.seq, message()?),
            DELETE_MESSAGE => self.delete_message(e.queue, e.seq),
            tag => return Err(format!("unknown entry tag {tag}")),
        }
        Ok(())
    }
}

/// One entry, as read back.
struct Entry<'a> {
    tag: u8,
    queue: &'a str,
    seq: u64,
    value: &'a [u8],
}

/// Appends the entry of `change` to `buf`.
fn encode(change: &Change, buf: &mut Vec<u8>) -> Result<(), LogError> {
    let (tag, queue, seq, value) = match change {
        Change::PutQueue(q) => (PUT_QUEUE, q.name.as_str(), 0, json(q)?),
        Change::DeleteQueue(name) => (DELETE_QUEUE, name.as_str(), 0, Vec::new()),
        Change::PurgeQueue(name) => (PURGE_QUEUE, name.as_str(), 0, Vec::new()),
        Change::PutMessage { queue, seq, message } => (PUT_MESSAGE, queue.as_str(), *seq, json(message)?),
        Change::DeleteMessage { queue, seq } => (DELETE_MESSAGE, queue.as_str(), *seq, Vec::new()),
    };
    push_entry(buf, tag, queue, seq, &value)
}

fn json(value: &impl serde::Serialize) -> Result<Vec<u8>, LogError> {
    serde_json::to_vec(value).map_err(|e| LogError::Unencodable(e.to_string()))
}

fn push_entry(buf: &mut Vec<u8>, tag: u8, queue: &str, seq: u64, value: &[u8]) -> Result<(), LogError> {
    let queue_len = u16::try_from(queue.len()).map_err(|_| LogError::Unencodable("a queue name too long".into()))?;
    let value_len = u32::try_from(value.len()).map_err(|_| LogError::Unencodable("a record too large".into()))?;
    buf.push(tag);
    buf.extend_from_slice(&queue_len.to_le_bytes());
    buf.extend_from_slice(queue.as_bytes());
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(&value_len.to_le_bytes());
    buf.extend_from_slice(value);
    Ok(())
}

/// Splits a payload into its entries with their offsets and lengths, or
/// says what is wrong with it.
fn entries(payload: &[u8]) -> impl Iterator<Item = Result<(usize, usize, Entry<'_>), String>> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= payload.len() {
            return None;
        }
        let start = at;
        let mut take = |n: usize| {
            let bytes = payload.get(at..at + n).ok_or("an entry runs past its record")?;
            at += n;
            Ok::<_, String>(bytes)
        };
        let entry = (|| {
            let tag = take(1)?[0];
            let queue_len = little_endian(take(2)?) as usize;
            let queue = std::str::from_utf8(take(queue_len)?).map_err(|_| "a queue name is not UTF-8")?;
            let seq = little_endian(take(8)?);
            let value_len = little_endian(take(4)?) as usize;
            let value = take(value_len)?;
            Ok(Entry { tag, queue, seq, value })
        })();
        match entry {
            Ok(entry) => Some(Ok((start, at - start, entry))),
            Err(e) => {
                at = payload.len();
                Some(Err(e))
            }
        }
    })
}

/// The little-endian integer of up to eight `bytes`.
fn little_endian(bytes: &[u8]) -> u64 {
    bytes.iter().rev().fold(0, |v, b| v << 8 | u64::from(*b))
}

fn from_json<T: serde::de::DeserializeOwned>(value: &[u8]) -> Result<T, String> {
    serde_json::from_slice(value).map_err(|e| e.to_string())
}

/// Makes a rename or a creation in `path`'s directory durable.
fn sync_dir(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => File::open(dir)?.sync_all(),
        _ => File::open(".")?.sync_all(),
    }
}

/// Writes records of whole entries to a new file.
struct RecordWriter {
    file: File,
    end: u64,
    buf: Vec<u8>,
}

impl RecordWriter {
    fn create(path: &Path) -> io::Result<Self> {
        // Read too: a compacted file is the log that the next compaction reads.
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.write_all(MAGIC)?;
        Ok(Self {
            file,
            end: MAGIC.len() as u64,
            buf: vec![0; HEADER],
        })
    }

    /// Adds an entry's bytes; returns where it will lie in the file.
    fn push(&mut self, entry: &[u8]) -> io::Result<Span> {
        if self.buf.len() + entry.len() > COPY_RECORD && self.buf.len() > HEADER {
            self.flush()?;
        }
        let span = Span {
            at: self.end + self.buf.len() as u64,
            len: u32::try_from(entry.len()).map_err(io::Error::other)?,
        };
        self.buf.extend_from_slice(entry);
        Ok(span)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buf.len() > HEADER {
            seal(&mut self.buf).map_err(io::Error::other)?;
            self.file.write_all(&self.buf)?;
            self.end += self.buf.len() as u64;
            self.buf.truncate(HEADER);
        }
        Ok(())
    }

    /// Flushes the last record and syncs the file.
    fn finish(mut self) -> io::Result<(File, u64)> {
        self.flush()?;
        self.file.sync_all()?;
        Ok((self.file, self.end))
    }
}

/// Fills in the header of a record whose payload follows `HEADER` bytes.
fn seal(record: &mut [u8]) -> Result<(), LogError> {
    let (header, payload) = record.split_at_mut(HEADER);
    let len = u32::try_from(payload.len()).map_err(|_| LogError::Unencodable("a group too large".into()))?;
    header[..4].copy_from_slice(&len.to_le_bytes());
    header[4..].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
    Ok(())
}

/// Writes a new journal at `path` holding `queues` and `messages` (a
/// journal's first version, or one migrated from an older format).
pub fn create(path: &Path, queues: &[StoredQueue], messages: &[(String, u64, StoredMessage)]) -> Result<(), LogError> {
    let tmp = sibling(path, "-new");
    let mut out = RecordWriter::create(&tmp)?;
    let mut entry = Vec::new();
    for q in queues {
        entry.clear();
        push_entry(&mut entry, PUT_QUEUE, &q.name, 0, &json(q)?)?;
        out.push(&entry)?;
    }
    for (queue, seq, message) in messages {
        entry.clear();
        push_entry(&mut entry, PUT_MESSAGE, queue, *seq, &json(message)?)?;
        out.push(&entry)?;
    }
    out.finish()?;
    std::fs::rename(&tmp, path)?;
    sync_dir(path)?;
    Ok(())
}

/// An open journal file, appended to by the journal's writer.
pub struct Log {
    path: PathBuf,
    file: File,
    end: u64,
    live: Tables<Span, Span>,
    buf: Vec<u8>,
    /// Set once a sync failed: what reached the disk is then unknown.
    poisoned: Option<String>,
    compact_min: u64,
    /// The file's size: `end` and the preallocated zeros after it.
    allocated: u64,
}

/// What a journal holds, as opening found it.
pub struct Opened {
    pub log: Log,
    pub queues: Vec<StoredQueue>,
    pub messages: Vec<(String, u64, StoredMessage)>,
    /// Whether opening cut off a torn write: a crash during a commit that
    /// was not answered.
    pub torn: bool,
}

impl Log {
    /// Opens the journal at `path` (which must exist), cutting off a torn
    /// last record.
    pub fn open(path: &Path) -> Result<Opened, LogError> {
        // A compaction or a creation that a crash interrupted.
        for stale in [sibling(path, "-compact"), sibling(path, "-new")] {
            match std::fs::remove_file(&stale) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
        let size = file.metadata()?.len();
        let mut reader = BufReader::with_capacity(1 << 16, &file);
        let mut magic = [0; MAGIC.len()];
        if reader.read_exact(&mut magic).is_err() || &magic != MAGIC {
            return Err(LogError::NotAJournal(path.to_owned()));
        }
        let damaged = |at: u64, what: String| LogError::Damaged {
            path: path.to_owned(),
            at,
            what,
        };
        let mut tables: Tables<(Span, StoredQueue), (Span, StoredMessage)> = Tables::new();
        let mut end = MAGIC.len() as u64;
        let mut payload = Vec::new();
        // Each pass reads one record; an invalid one ends the log there.
        while let Some((len, crc)) = next_header(&mut reader, size - end)? {
            payload.resize(len, 0);
            reader.read_exact(&mut payload)?;
            if crc32fast::hash(&payload) != crc {
                break;
            }
            let base = end + HEADER as u64;
            for entry in entries(&payload) {
                let (offset, len, e) = entry.map_err(|what| damaged(end, what))?;
                let span = Span {
                    at: base + offset as u64,
                    len: u32::try_from(len).map_err(io::Error::other)?,
                };
                tables
                    .apply(
                        &e,
                        || Ok((span, from_json(e.value)?)),
                        || Ok((span, from_json(e.value)?)),
                    )
                    .map_err(|what| damaged(span.at, what))?;
            }
            end = base + len as u64;
        }
        drop(reader);
        let mut torn = false;
        if end < size {
            let mut tail = vec![0; usize::try_from(size - end).map_err(io::Error::other)?];
            file.read_exact_at(&mut tail, end)?;
            if let Some(at) = whole_record(&tail) {
                return Err(damaged(
                    end,
                    format!(
                        "an invalid record, and a valid one after it at byte {}",
                        end + at as u64
                    ),
                ));
            }
            // Zeros are what preallocation left (after every clean
            // shutdown too): only other bytes are a write a crash tore.
            torn = tail.iter().any(|b| *b != 0);
            file.set_len(end)?;
            file.sync_all()?;
        }
        let mut live = Tables::new();
        let mut queues = Vec::with_capacity(tables.queues.len());
        let mut messages = Vec::new();
        for (name, (span, queue)) in tables.queues {
            live.put_queue(&name, span);
            queues.push(queue);
        }
        for (queue, held) in tables.messages {
            for (seq, (span, message)) in held {
                live.put_message(&queue, seq, span);
                messages.push((queue.clone(), seq, message));
            }
        }
        messages.sort_by_key(|(_, seq, _)| *seq);
        Ok(Opened {
            log: Self {
                path: path.to_owned(),
                file,
                end,
                live,
                buf: Vec::new(),
                poisoned: None,
                compact_min: COMPACT_MIN,
                allocated: end,
            },
            queues,
            messages,
            torn,
        })
    }

    /// Lowers the compaction threshold (tests compact small journals).
    #[cfg(test)]
    pub fn compact_above(&mut self, bytes: u64) {
        self.compact_min = bytes;
    }

    /// Writes `changes` as one record; [`Log::sync`] makes it durable.
    pub fn commit<'a>(&mut self, changes: impl Iterator<Item = &'a Change>) -> Result<(), LogError> {
        if let Some(e) = &self.poisoned {
            return Err(LogError::Poisoned(e.clone()));
        }
        self.buf.clear();
        self.buf.resize(HEADER, 0);
        for change in changes {
            encode(change, &mut self.buf)?;
        }
        seal(&mut self.buf)?;
        if self.end + self.buf.len() as u64 > self.allocated {
            self.preallocate(self.end + self.buf.len() as u64)?;
        }
        if let Err(e) = self.file.write_all_at(&self.buf, self.end) {
            // A partial record would read as damage once a later one follows.
            match self.file.set_len(self.end) {
                Ok(()) => self.allocated = self.end,
                Err(cut) => self.poisoned = Some(cut.to_string()),
            }
            return Err(e.into());
        }
        let base = self.end + HEADER as u64;
        for (offset, len, e) in entries(&self.buf[HEADER..]).flatten() {
            let span = Span {
                at: base + offset as u64,
                len: u32::try_from(len).unwrap_or(u32::MAX),
            };
            // The log's own encoding: every entry parses, every tag is known.
            let _ = self.live.apply(&e, || Ok(span), || Ok(span));
        }
        self.end += self.buf.len() as u64;
        Ok(())
    }

    /// Makes every record written so far durable.
    pub fn sync(&mut self) -> Result<(), LogError> {
        if let Some(e) = &self.poisoned {
            return Err(LogError::Poisoned(e.clone()));
        }
        if let Err(e) = self.file.sync_data() {
            // After a failed sync the kernel may have dropped the pages: what
            // the file holds is unknown, so nothing more is written to it.
            self.poisoned = Some(e.to_string());
            return Err(e.into());
        }
        Ok(())
    }

    /// Extends the file with synced zeros past `needed`, so that commits
    /// overwrite allocated blocks: syncing an append also journals the
    /// file's new size, which took commits about half again as long here.
    fn preallocate(&mut self, needed: u64) -> Result<(), LogError> {
        let size = needed.div_ceil(PREALLOCATE) * PREALLOCATE;
        let zeros = vec![0; 1 << 20];
        let mut at = self.allocated;
        while at < size {
            let n = (size - at).min(zeros.len() as u64);
            self.file.write_all_at(&zeros[..n as usize], at)?;
            at += n;
        }
        if let Err(e) = self.file.sync_data() {
            self.poisoned = Some(e.to_string());
            return Err(e.into());
        }
        self.allocated = size;
        Ok(())
    }

    /// Compacts the log once its dead entries outweigh the live ones (and
    /// the threshold). A failure leaves the old file in use, or poisons the
    /// log if the new one may already have replaced it.
    pub fn compact_if_due(&mut self) {
        let dead = self.end - self.live.bytes;
        if self.poisoned.is_none()
            && dead > self.compact_min.max(self.live.bytes)
            && let Err(e) = self.compact()
        {
            tracing::error!(journal = %self.path.display(), error = %e, "compacting the queue journal failed");
        }
    }

    /// Copies the live entries into a new file and renames it over the log.
    /// It runs between commits, so the writer waits for it: its cost is the
    /// live entries' size, paid once per as many dead bytes.
    fn compact(&mut self) -> Result<(), LogError> {
        let started = std::time::Instant::now();
        let tmp = sibling(&self.path, "-compact");
        let mut out = RecordWriter::create(&tmp)?;
        let mut live = Tables::new();
        let mut entry = Vec::new();
        let mut copy = |span: Span, out: &mut RecordWriter| -> io::Result<Span> {
            entry.resize(usize::try_from(span.len).map_err(io::Error::other)?, 0);
            self.file.read_exact_at(&mut entry, span.at)?;
            out.push(&entry)
        };
        for (name, span) in &self.live.queues {
            live.put_queue(name, copy(*span, &mut out)?);
        }
        for (queue, held) in &self.live.messages {
            for (seq, span) in held {
                live.put_message(queue, *seq, copy(*span, &mut out)?);
            }
        }
        let (file, end) = match out.finish() {
            Ok(done) => done,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e.into());
            }
        };
        if let Err(e) = std::fs::rename(&tmp, &self.path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
        // Appending to the new file before its name is durable could lose
        // those appends to a crash that brings the old name back.
        if let Err(e) = sync_dir(&self.path) {
            self.poisoned = Some(e.to_string());
            return Err(e.into());
        }
        let before = std::mem::replace(&mut self.end, end);
        self.allocated = end;
        self.file = file;
        self.live = live;
        tracing::info!(
            journal = %self.path.display(),
            before,
            after = self.end,
            ms = started.elapsed().as_millis(),
            "compacted the queue journal"
        );
        Ok(())
    }
}

/// The length and CRC in the record header that `bytes` start with (at
/// least [`HEADER`] of them).
fn parse_header(bytes: &[u8]) -> (u32, u32) {
    (
        little_endian(&bytes[..4]) as u32,
        little_endian(&bytes[4..HEADER]) as u32,
    )
}

/// The length and CRC of the record at the reader, if a record of that
/// length fits in the `left` bytes.
fn next_header(reader: &mut impl Read, left: u64) -> io::Result<Option<(usize, u32)>> {
    if left < HEADER as u64 {
        return Ok(None);
    }
    let mut header = [0; HEADER];
    reader.read_exact(&mut header)?;
    let (len, crc) = parse_header(&header);
    let fits = len != 0 && u64::from(len) <= left - HEADER as u64;
    Ok(fits.then_some((len as usize, crc)))
}

/// Where a whole record with a matching checksum starts in `tail`, if
/// anywhere. Past the last synced record a crash leaves only the pages of
/// the one record being written, in any order, then the preallocated
/// zeros; a whole record there means the invalid one before it was
/// damaged after it was synced.
fn whole_record(tail: &[u8]) -> Option<usize> {
    (0..tail.len().saturating_sub(HEADER)).find(|&at| {
        let (len, crc) = parse_header(&tail[at..]);
        let len = len as usize;
        let payload = at + HEADER;
        len != 0 && len <= tail.len() - payload && crc32fast::hash(&tail[payload..payload + len]) == crc
    })
}

#[cfg(test)]
mod tests;
