//! The record files of queue engines. Each file starts with eight bytes
//! naming its kind; each record after them is
//! `[payload length: u32 LE][CRC-32 of the payload: u32 LE][payload]`, and a
//! payload is one entry after another,
//! `[tag: u8][queue name length: u16 LE][queue name][seq: u64 LE][value length: u32 LE][value]`,
//! the value being the JSON of the machine's header, a queue, a message or
//! a command. Two kinds are written today: a replica's snapshot
//! ([`SNAPSHOT_MAGIC`]: its position in the log, then the machine) and, in
//! `super::super::raft`, the Raft log. The journal of the version before
//! ([`MAGIC`]: a snapshot, then the commands applied after it) is only read,
//! once, to start a replica from it.
//!
//! A crash can tear only the last record written: a file is read up to its
//! first invalid record. A whole valid record after an invalid one means
//! damage, not a torn write, and reading refuses it rather than drop what
//! follows.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::sibling;
use crate::engine::machine::{Identity, Machine};

/// The first bytes of a journal of the version before.
const MAGIC: &[u8; 8] = b"SLESSQJ2";
/// The first bytes of a journal of the format before: live records of
/// queues and messages (see [`super::v1`]).
pub const V1_MAGIC: &[u8; 8] = b"SLESSQJ1";
/// Bytes before each record's payload: its length and CRC.
pub(crate) const HEADER: usize = 8;
/// A snapshot is written in records of about this size.
const COPY_RECORD: usize = 1 << 20;

/// The machine's header: next sequence, clock, deleted names, move tasks.
const MACHINE: u8 = 16;
/// A queue, without its messages.
const QUEUE: u8 = 17;
/// A message of the queue the entry names, as sequence `seq`.
const MESSAGE: u8 = 18;
/// A command applied after the snapshot.
const COMMAND: u8 = 19;
/// A snapshot file's position in the replicated log it was taken of.
const META: u8 = 20;
/// The first bytes of a snapshot file of a replicated engine.
const SNAPSHOT_MAGIC: &[u8; 8] = b"SLESSQS1";

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
}

/// One entry, as read back.
pub(super) struct Entry<'a> {
    pub tag: u8,
    pub queue: &'a str,
    pub seq: u64,
    pub value: &'a [u8],
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
pub(super) fn entries(payload: &[u8]) -> impl Iterator<Item = Result<(usize, usize, Entry<'_>), String>> {
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

pub(super) fn from_json<T: serde::de::DeserializeOwned>(value: &[u8]) -> Result<T, String> {
    serde_json::from_slice(value).map_err(|e| e.to_string())
}

/// Makes a rename or a creation in `path`'s directory durable.
pub(crate) fn sync_dir(path: &Path) -> io::Result<()> {
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
    fn create(path: &Path, magic: &[u8; 8]) -> io::Result<Self> {
        // Read too: a compacted file is the log that the next compaction reads.
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.write_all(magic)?;
        Ok(Self {
            file,
            end: magic.len() as u64,
            buf: vec![0; HEADER],
        })
    }

    /// Adds an entry's bytes.
    fn push(&mut self, entry: &[u8]) -> io::Result<()> {
        if self.buf.len() + entry.len() > COPY_RECORD && self.buf.len() > HEADER {
            self.flush()?;
        }
        self.buf.extend_from_slice(entry);
        Ok(())
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
pub(crate) fn seal(record: &mut [u8]) -> Result<(), LogError> {
    let (header, payload) = record.split_at_mut(HEADER);
    let len = u32::try_from(payload.len()).map_err(|_| LogError::Unencodable("a group too large".into()))?;
    header[..4].copy_from_slice(&len.to_le_bytes());
    header[4..].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
    Ok(())
}

/// Writes `machine` as a snapshot's entries.
fn write_snapshot(out: &mut RecordWriter, machine: &Machine) -> Result<(), LogError> {
    let mut entry = Vec::new();
    push_entry(&mut entry, MACHINE, "", 0, &json(&machine.header())?)?;
    out.push(&entry)?;
    for (name, q) in &machine.queues {
        entry.clear();
        push_entry(&mut entry, QUEUE, name, 0, &json(&q.image())?)?;
        out.push(&entry)?;
        for (seq, m) in &q.messages {
            entry.clear();
            push_entry(&mut entry, MESSAGE, name, *seq, &json(&m.image())?)?;
            out.push(&entry)?;
        }
    }
    Ok(())
}

/// Writes a snapshot file at `path` (replaced whole, synced): `meta` (the
/// replicated log's position it stands for, opaque here), then `machine`.
pub fn write_snapshot_file(path: &Path, meta: &[u8], machine: &Machine) -> Result<File, LogError> {
    let tmp = sibling(path, "-new");
    let mut out = RecordWriter::create(&tmp, SNAPSHOT_MAGIC)?;
    let mut entry = Vec::new();
    push_entry(&mut entry, META, "", 0, meta)?;
    out.push(&entry)?;
    write_snapshot(&mut out, machine)?;
    let (file, _) = out.finish()?;
    std::fs::rename(&tmp, path)?;
    sync_dir(path)?;
    Ok(file)
}

/// The `meta` and the machine (for `identity`) of the snapshot file at
/// `path`; a file cut short is refused, not read in part.
pub fn read_snapshot_file(path: &Path, identity: Identity) -> Result<(Vec<u8>, Machine), LogError> {
    let file = File::open(path)?;
    let mut machine = Machine::new(identity);
    let mut meta = None;
    let scanned = scan(&file, path, SNAPSHOT_MAGIC, |e| match e.tag {
        META => {
            meta = Some(e.value.to_vec());
            Ok(())
        }
        COMMAND => Err("a command in a snapshot".into()),
        _ => replay(&mut machine, e),
    })?;
    let damaged = |what: &str| LogError::Damaged {
        path: path.to_owned(),
        at: scanned.end,
        what: what.to_owned(),
    };
    if scanned.end != file.metadata()?.len() {
        return Err(damaged("the snapshot is cut short"));
    }
    Ok((meta.ok_or_else(|| damaged("no meta"))?, machine))
}

/// Only the `meta` of the snapshot file `file` (at `path`): its first
/// entry. The file's position is left at its start.
pub fn read_snapshot_meta(file: &File, path: &Path) -> Result<Vec<u8>, LogError> {
    let size = file.metadata()?.len();
    let mut reader = BufReader::new(file);
    let mut magic = [0; 8];
    if reader.read_exact(&mut magic).is_err() || &magic != SNAPSHOT_MAGIC {
        return Err(LogError::NotAJournal(path.to_owned()));
    }
    let damaged = |what: &str| LogError::Damaged {
        path: path.to_owned(),
        at: SNAPSHOT_MAGIC.len() as u64,
        what: what.to_owned(),
    };
    let (len, crc) = next_header(&mut reader, size - SNAPSHOT_MAGIC.len() as u64)?.ok_or_else(|| damaged("no meta"))?;
    let mut payload = vec![0; len];
    reader.read_exact(&mut payload)?;
    if crc32fast::hash(&payload) != crc {
        return Err(damaged("its first record is invalid"));
    }
    let meta = match entries(&payload).next() {
        Some(Ok((_, _, e))) if e.tag == META => e.value.to_vec(),
        _ => return Err(damaged("no meta")),
    };
    drop(reader);
    (&*file).seek(std::io::SeekFrom::Start(0))?;
    Ok(meta)
}

/// Applies one entry of a journal to `machine`: the snapshot's entries
/// rebuild it, the commands after them are applied again, as they were.
fn replay(machine: &mut Machine, e: &Entry<'_>) -> Result<(), String> {
    match e.tag {
        MACHINE => machine.restore_header(from_json(e.value)?),
        QUEUE => machine.restore_queue(from_json(e.value)?),
        MESSAGE => machine.restore_message(e.queue, e.seq, from_json(e.value)?)?,
        // Its reply went to its request; an error here was its reply then.
        COMMAND => drop(machine.apply(from_json(e.value)?)),
        tag => return Err(format!("unknown entry tag {tag}")),
    }
    Ok(())
}

/// Where a scan of a log file ended.
pub(super) struct Scanned {
    /// The end of its last valid record.
    pub end: u64,
    /// Whether bytes other than zeros follow `end`.
    pub torn: bool,
}

/// Reads the log file `file` of format `magic` record by record, giving
/// each entry to `on_entry`, up to its first invalid record.
pub(super) fn scan(
    file: &File,
    path: &Path,
    magic: &[u8; 8],
    mut on_entry: impl FnMut(&Entry<'_>) -> Result<(), String>,
) -> Result<Scanned, LogError> {
    let size = file.metadata()?.len();
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let mut found = [0; 8];
    if reader.read_exact(&mut found).is_err() || &found != magic {
        return Err(LogError::NotAJournal(path.to_owned()));
    }
    let damaged = |at: u64, what: String| LogError::Damaged {
        path: path.to_owned(),
        at,
        what,
    };
    let mut end = magic.len() as u64;
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
            let (offset, _, e) = entry.map_err(|what| damaged(end, what))?;
            on_entry(&e).map_err(|what| damaged(base + offset as u64, what))?;
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
    }
    Ok(Scanned { end, torn })
}

/// The machine (for `identity`) that the journal at `path` holds, and
/// whether its last write was torn (a crash during a commit nobody was
/// answered for).
pub fn read_journal(path: &Path, identity: Identity) -> Result<(Machine, bool), LogError> {
    let file = File::open(path)?;
    let mut machine = Machine::new(identity);
    let Scanned { torn, .. } = scan(&file, path, MAGIC, |e| replay(&mut machine, e))?;
    Ok((machine, torn))
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
pub(crate) fn next_header(reader: &mut impl Read, left: u64) -> io::Result<Option<(usize, u32)>> {
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
pub(crate) fn whole_record(tail: &[u8]) -> Option<usize> {
    (0..tail.len().saturating_sub(HEADER)).find(|&at| {
        let (len, crc) = parse_header(&tail[at..]);
        let len = len as usize;
        let payload = at + HEADER;
        len != 0 && len <= tail.len() - payload && crc32fast::hash(&tail[payload..payload + len]) == crc
    })
}

#[cfg(test)]
mod tests;
