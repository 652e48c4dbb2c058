//! Transactions that pgoutput (protocol version 2, `streaming 'on'`) sends
//! while they are still in progress, once they outgrow the server's
//! `logical_decoding_work_mem`. Their changes may yet abort (whole, or a
//! subtransaction of them), so they are kept here until the stream's commit
//! and then replayed, in order, through the [`super::pgoutput::Decoder`]
//! as one ordinary transaction; an abort drops them. What they keep is in
//! memory up to [`IN_MEMORY`] for all of them together and in a file of
//! each one's own beyond, so a transaction larger than memory passes
//! through; the files are removed when the transaction ends or the source
//! stops. The server is the tenant's: how many transactions it streams at
//! once and how much they keep are bounded ([`Limits`]), and what they keep
//! counts against the tenant's and the process's budgets
//! ([`crate::budget`]). File work runs off the async threads.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::path::PathBuf;

use bytes::{Buf, BufMut};

use crate::ConnectorError;
use crate::budget::Allowance;

/// What the transactions in progress keep in memory, together, before
/// each one's part goes to its file.
pub const IN_MEMORY: usize = 1 << 20;

/// How much a server may make the streams keep.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Transactions streaming at once.
    pub open: usize,
    /// Bytes kept by them together, in memory and in files.
    pub kept: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            open: 1024,
            kept: 8 << 30,
        }
    }
}

/// What one message of the replication stream is to the streams.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Not part of a streamed transaction: decode it as it is.
    Decode,
    /// Kept (or a stream's start, stop or abort): nothing to decode now.
    Kept,
    /// A streamed transaction committed: replay it with [`Streams::replay`],
    /// between a Begin and this Commit.
    Commit {
        xid: u32,
        /// The Begin message to decode before the replay.
        begin: Vec<u8>,
        /// The Commit message to decode after it.
        commit: Vec<u8>,
    },
}

/// One transaction's kept messages.
struct Kept {
    memory: Vec<u8>,
    file: Option<PathBuf>,
    /// Bytes kept, in memory and in its file.
    bytes: u64,
    /// Subtransactions aborted: their messages are skipped at replay.
    aborted: HashSet<u32>,
}

/// The streamed transactions in progress.
pub struct Streams {
    dir: PathBuf,
    limits: Limits,
    budget: Allowance,
    /// The transaction whose stream block is open.
    current: Option<u32>,
    kept: HashMap<u32, Kept>,
    /// Bytes kept by all, and of those in memory.
    bytes: u64,
    in_memory: usize,
}

fn bad(what: &str) -> ConnectorError {
    ConnectorError::Closed(format!("pgoutput stream: {what}"))
}

fn file_error(e: impl std::fmt::Display) -> ConnectorError {
    ConnectorError::Transient(format!("a streamed transaction's file: {e}"))
}

/// Runs file work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, ConnectorError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(file_error)?
        .map_err(file_error)
}

impl Streams {
    /// Streams kept under `dir` (made when first needed), within `limits`
    /// and `budget`.
    pub fn new(dir: PathBuf, limits: Limits, budget: Allowance) -> Self {
        Self {
            dir,
            limits,
            budget,
            current: None,
            kept: HashMap::new(),
            bytes: 0,
            in_memory: 0,
        }
    }

    /// Takes a transaction out of the streams' accounts; what it keeps is
    /// still counted against the budget until the caller gives it back.
    fn forget(&mut self, xid: u32) -> Option<Kept> {
        let kept = self.kept.remove(&xid)?;
        self.bytes -= kept.bytes;
        self.in_memory -= kept.memory.len();
        Some(kept)
    }

    /// Takes one message (WAL at `lsn`): keeps it when it belongs to a
    /// streamed transaction, and says what to do with it.
    pub async fn take(&mut self, lsn: u64, data: &[u8]) -> Result<Step, ConnectorError> {
        let mut r = data;
        let Some(&tag) = r.first() else {
            return Err(bad("an empty message"));
        };
        r.advance(1);
        let u32_of = |r: &mut &[u8]| {
            if r.len() < 4 {
                return Err(bad("a message cut short"));
            }
            Ok(r.get_u32())
        };
        match tag {
            b'S' => {
                let xid = u32_of(&mut r)?;
                if !self.kept.contains_key(&xid) && self.kept.len() >= self.limits.open {
                    return Err(bad(&format!(
                        "more than {} transactions streaming at once",
                        self.limits.open
                    )));
                }
                self.current = Some(xid);
                self.kept.entry(xid).or_insert_with(|| Kept {
                    memory: Vec::new(),
                    file: None,
                    bytes: 0,
                    aborted: HashSet::new(),
                });
                Ok(Step::Kept)
            }
            b'E' => {
                self.current = None;
                Ok(Step::Kept)
            }
            b'A' => {
                let xid = u32_of(&mut r)?;
                let sub = u32_of(&mut r)?;
                if sub == xid {
                    if let Some(kept) = self.forget(xid) {
                        remove(kept.file).await;
                        self.budget.give(kept.bytes);
                    }
                } else if let Some(kept) = self.kept.get_mut(&xid) {
                    kept.aborted.insert(sub);
                }
                Ok(Step::Kept)
            }
            b'c' => {
                let xid = u32_of(&mut r)?;
                if r.len() < 25 {
                    return Err(bad("a stream commit cut short"));
                }
                let flags = r.get_u8();
                let (commit_lsn, end_lsn, time) = (r.get_u64(), r.get_u64(), r.get_u64());
                let mut begin = vec![b'B'];
                begin.put_u64(commit_lsn);
                begin.put_u64(time);
                begin.put_u32(xid);
                let mut commit = vec![b'C', flags];
                commit.put_u64(commit_lsn);
                commit.put_u64(end_lsn);
                commit.put_u64(time);
                Ok(Step::Commit { xid, begin, commit })
            }
            // In a stream block every other message carries the (sub)
            // transaction's xid after its tag.
            _ => match self.current {
                None => Ok(Step::Decode),
                Some(top) => {
                    let xid = u32_of(&mut r)?;
                    self.keep(top, xid, lsn, tag, r).await?;
                    Ok(Step::Kept)
                }
            },
        }
    }

    async fn keep(&mut self, top: u32, xid: u32, lsn: u64, tag: u8, rest: &[u8]) -> Result<(), ConnectorError> {
        let len = u32::try_from(rest.len() + 1).map_err(|_| bad("a message over 4 GiB"))?;
        let entry = 16 + u64::from(len);
        if self.bytes + entry > self.limits.kept {
            return Err(bad(&format!(
                "transactions in progress would keep more than {} bytes",
                self.limits.kept
            )));
        }
        let kept = self
            .kept
            .get_mut(&top)
            .ok_or_else(|| bad("a change outside its stream"))?;
        self.budget.take(entry)?;
        kept.memory.put_u32(len);
        kept.memory.put_u32(xid);
        kept.memory.put_u64(lsn);
        kept.memory.put_u8(tag);
        kept.memory.extend_from_slice(rest);
        kept.bytes += entry;
        self.bytes += entry;
        self.in_memory += entry as usize;
        if self.in_memory >= IN_MEMORY {
            self.spill().await?;
        }
        Ok(())
    }

    /// Appends what every transaction keeps in memory to its file.
    async fn spill(&mut self) -> Result<(), ConnectorError> {
        let mut chunks = Vec::new();
        for (top, kept) in &mut self.kept {
            if kept.memory.is_empty() {
                continue;
            }
            let path = kept
                .file
                .get_or_insert_with(|| self.dir.join(format!("{top}.{}", rand::random::<u64>())))
                .clone();
            chunks.push((path, std::mem::take(&mut kept.memory)));
        }
        self.in_memory = 0;
        let dir = self.dir.clone();
        blocking(move || {
            // The tenant's rows: readable by this process's user only.
            let mut builder = std::fs::DirBuilder::new();
            builder.recursive(true);
            let mut options = std::fs::OpenOptions::new();
            options.create(true).append(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
                builder.mode(0o700);
                options.mode(0o600);
            }
            builder.create(&dir)?;
            for (path, chunk) in chunks {
                options.open(&path)?.write_all(&chunk)?;
            }
            Ok(())
        })
        .await
    }

    /// The messages of committed transaction `xid`, in order, without
    /// those of its aborted subtransactions: (WAL position, message).
    pub fn replay(&mut self, xid: u32) -> Replay {
        let kept = self.forget(xid);
        let (memory, file, aborted, bytes) = match kept {
            Some(k) => (k.memory, k.file, k.aborted, k.bytes),
            None => (Vec::new(), None, HashSet::new(), 0),
        };
        Replay {
            file,
            offset: 0,
            memory: Some(memory),
            carry: Vec::new(),
            aborted,
            budget: self.budget.clone(),
            bytes,
        }
    }

    /// Removes every kept transaction's file (the source stops).
    pub fn clear(&mut self) {
        for (_, kept) in self.kept.drain() {
            if let Some(path) = kept.file {
                let _ = std::fs::remove_file(path);
            }
        }
        self.budget.give(self.bytes);
        self.bytes = 0;
        self.in_memory = 0;
    }
}

impl Drop for Streams {
    fn drop(&mut self) {
        self.clear();
        // Only when empty: a replay's file may still be in it.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

async fn remove(file: Option<PathBuf>) {
    if let Some(path) = file {
        let _ = blocking(move || std::fs::remove_file(path)).await;
    }
}

/// A committed streamed transaction being replayed: its file first (what
/// went there went first), then what stayed in memory.
pub struct Replay {
    file: Option<PathBuf>,
    offset: u64,
    memory: Option<Vec<u8>>,
    /// The end of the last chunk read that does not hold a whole entry.
    carry: Vec<u8>,
    aborted: HashSet<u32>,
    /// What it keeps, counted against the budget until it is dropped (its
    /// file is removed then).
    budget: Allowance,
    bytes: u64,
}

impl Replay {
    /// The next messages, `None` at the end.
    pub async fn next(&mut self) -> Result<Option<Vec<(u64, Vec<u8>)>>, ConnectorError> {
        let chunk = match &self.file {
            Some(path) => {
                let (path, offset) = (path.clone(), self.offset);
                let read = blocking(move || {
                    let mut file = std::fs::File::open(&path)?;
                    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(offset))?;
                    let mut chunk = Vec::with_capacity(IN_MEMORY);
                    file.take(IN_MEMORY as u64).read_to_end(&mut chunk)?;
                    Ok(chunk)
                })
                .await?;
                if read.is_empty() {
                    remove(self.file.take()).await;
                    return Box::pin(self.next()).await;
                }
                self.offset += read.len() as u64;
                read
            }
            None => match self.memory.take() {
                Some(memory) => memory,
                None if self.carry.is_empty() => return Ok(None),
                None => return Err(bad("a kept transaction ends inside a message")),
            },
        };
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(&chunk);
        let mut messages = Vec::new();
        let mut r = &bytes[..];
        while r.len() >= 16 {
            let len = (&r[..4]).get_u32() as usize;
            if r.len() < 16 + len {
                break;
            }
            r.advance(4);
            let (xid, lsn) = (r.get_u32(), r.get_u64());
            if !self.aborted.contains(&xid) {
                messages.push((lsn, r[..len].to_vec()));
            }
            r.advance(len);
        }
        self.carry = r.to_vec();
        Ok(Some(messages))
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        if let Some(path) = self.file.take() {
            let _ = std::fs::remove_file(path);
        }
        self.budget.give(self.bytes);
    }
}

/// Removes the spill directories releases before this one made for the
/// slot under the system's temporary directory (`sless-cdc-<slot>-N`),
/// which only a clean stop removed.
pub(super) async fn remove_old_spill(slot: &str) {
    let prefix = format!("sless-cdc-{slot}-");
    let _ = tokio::task::spawn_blocking(move || {
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let ours = entry
                .file_name()
                .to_str()
                .and_then(|name| name.strip_prefix(&prefix))
                .is_some_and(|rest| rest.bytes().all(|b| b.is_ascii_digit()));
            if ours {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget() -> Allowance {
        crate::budget::FlowBudget::temporary().spill
    }

    fn in_stream(tag: u8, xid: u32, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.put_u32(xid);
        m.extend_from_slice(body);
        m
    }

    async fn replayed(streams: &mut Streams, xid: u32) -> Vec<(u64, Vec<u8>)> {
        let mut replay = streams.replay(xid);
        let mut all = Vec::new();
        while let Some(messages) = replay.next().await.unwrap() {
            all.extend(messages);
        }
        all
    }

    #[tokio::test]
    async fn a_committed_stream_replays_in_order_without_its_aborted_subtransaction_even_from_its_file() {
        let dir = std::env::temp_dir().join(format!("sless-streams-test-{}", rand::random::<u64>()));
        let mut streams = Streams::new(dir.clone(), Limits::default(), budget());
        assert_eq!(streams.take(1, &in_stream(b'S', 7, &[1])).await.unwrap(), Step::Kept);
        // Enough to go to the file, in messages of 1 KiB.
        let big = vec![b'x'; 1024];
        for i in 0..1500u64 {
            let sub = if i % 10 == 0 { 8 } else { 7 };
            assert_eq!(
                streams.take(100 + i, &in_stream(b'I', sub, &big)).await.unwrap(),
                Step::Kept
            );
        }
        assert_eq!(streams.take(2, b"E").await.unwrap(), Step::Kept);
        // An ordinary transaction between stream blocks decodes as it is.
        assert_eq!(streams.take(3, b"B....").await.unwrap(), Step::Decode);
        let mut abort = vec![b'A'];
        abort.put_u32(7);
        abort.put_u32(8);
        assert_eq!(streams.take(4, &abort).await.unwrap(), Step::Kept);
        let mut commit = vec![b'c'];
        commit.put_u32(7);
        commit.put_u8(0);
        commit.put_u64(0x500);
        commit.put_u64(0x508);
        commit.put_u64(99);
        let Step::Commit { xid, begin, commit } = streams.take(5, &commit).await.unwrap() else {
            panic!("a commit");
        };
        assert_eq!(xid, 7);
        assert_eq!((begin[0], commit[0]), (b'B', b'C'));
        assert!(std::fs::read_dir(&dir).unwrap().count() == 1, "kept in a file");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
            let file = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
            assert_eq!(std::fs::metadata(file).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let messages = replayed(&mut streams, 7).await;
        assert_eq!(messages.len(), 1350, "the aborted subtransaction's 150 left out");
        assert!(messages.windows(2).all(|w| w[0].0 < w[1].0), "in order");
        assert!(messages.iter().all(|(_, m)| m[0] == b'I' && m.len() == 1025));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the file is removed");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A server streaming more transactions at once, or keeping more bytes,
    /// than the limits is refused with the reason; what ended frees room.
    #[tokio::test]
    async fn a_server_cannot_make_the_streams_keep_more_than_the_limits() {
        let dir = std::env::temp_dir().join(format!("sless-streams-test-{}", rand::random::<u64>()));
        let mut streams = Streams::new(dir.clone(), Limits { open: 2, kept: 10_000 }, budget());
        streams.take(1, &in_stream(b'S', 1, &[1])).await.unwrap();
        streams.take(2, &in_stream(b'S', 2, &[1])).await.unwrap();
        let refused = streams.take(3, &in_stream(b'S', 3, &[1])).await.unwrap_err();
        assert!(refused.to_string().contains("more than 2 transactions"), "{refused}");
        let mut abort = vec![b'A'];
        abort.put_u32(1);
        abort.put_u32(1);
        streams.take(4, &abort).await.unwrap();
        streams.take(5, &in_stream(b'S', 3, &[1])).await.unwrap();
        let big = vec![b'x'; 4000];
        streams.take(6, &in_stream(b'I', 3, &big)).await.unwrap();
        streams.take(7, &in_stream(b'I', 3, &big)).await.unwrap();
        let refused = streams.take(8, &in_stream(b'I', 3, &big)).await.unwrap_err();
        assert!(refused.to_string().contains("more than 10000 bytes"), "{refused}");
        assert_eq!(replayed(&mut streams, 3).await.len(), 2);
        streams.take(9, &in_stream(b'S', 2, &[1])).await.unwrap();
        streams.take(10, &in_stream(b'I', 2, &big)).await.unwrap();
        drop(streams);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// What the streams keep counts against the tenant's budget, beside
    /// the other dataflows': over it, refused with the reason; what ends
    /// (a commit's replay, a stop) gives its bytes back.
    #[tokio::test]
    async fn the_streams_keep_within_the_tenants_budget() {
        use crate::budget::{BudgetArgs, Budgets};
        let root = std::env::temp_dir().join(format!("sless-streams-test-{}", rand::random::<u64>()));
        let budgets = Budgets::new(
            root.clone(),
            BudgetArgs {
                tenant_spill_mb: 1,
                ..BudgetArgs::default()
            },
        );
        let (one, other) = (budgets.for_flow("a", "a/one"), budgets.for_flow("a", "a/other"));
        let mut streams = Streams::new(one.spill_dir.clone(), Limits::default(), one.spill.clone());
        // Another flow of the tenant keeps 600 KiB.
        other.spill.take(600 << 10).unwrap();
        streams.take(1, &in_stream(b'S', 7, &[1])).await.unwrap();
        let row = vec![b'x'; 1000];
        let mut refused = None;
        for lsn in 2..1000 {
            if let Err(e) = streams.take(lsn, &in_stream(b'I', 7, &row)).await {
                refused = Some(e);
                break;
            }
        }
        let refused = refused.expect("the budget refuses").to_string();
        assert!(
            refused.contains("tenant's dataflows") && refused.contains("at most 1 MiB"),
            "{refused}"
        );
        // Stopping gives the bytes back: the other flow may take them.
        drop(streams);
        other.spill.take(400 << 10).unwrap();
        let _ = std::fs::remove_dir_all(root);
    }

    /// Many transactions at once keep a MiB in memory together, not each.
    #[tokio::test]
    async fn the_memory_kept_is_bounded_across_transactions() {
        let dir = std::env::temp_dir().join(format!("sless-streams-test-{}", rand::random::<u64>()));
        let mut streams = Streams::new(dir.clone(), Limits::default(), budget());
        let row = vec![b'x'; 1000];
        for xid in 1..=100u32 {
            streams.take(1, &in_stream(b'S', xid, &[1])).await.unwrap();
            for _ in 0..20 {
                streams.take(2, &in_stream(b'I', xid, &row)).await.unwrap();
                assert!(streams.in_memory < IN_MEMORY, "{} bytes in memory", streams.in_memory);
            }
            streams.take(3, b"E").await.unwrap();
        }
        assert_eq!(
            replayed(&mut streams, 50).await.len(),
            20,
            "what went to a file comes back"
        );
        drop(streams);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn an_aborted_stream_leaves_nothing_and_cut_messages_are_errors() {
        let dir = std::env::temp_dir().join(format!("sless-streams-test-{}", rand::random::<u64>()));
        let mut streams = Streams::new(dir, Limits::default(), budget());
        streams.take(1, &in_stream(b'S', 9, &[1])).await.unwrap();
        streams.take(2, &in_stream(b'I', 9, b"row")).await.unwrap();
        let mut abort = vec![b'A'];
        abort.put_u32(9);
        abort.put_u32(9);
        streams.take(3, &abort).await.unwrap();
        assert!(replayed(&mut streams, 9).await.is_empty());
        for cut in [&b""[..], b"S\x00", b"A\x00\x00\x00\x01", b"c\x00\x00\x00\x01\x00"] {
            assert!(streams.take(4, cut).await.is_err(), "{cut:?}");
        }
    }
}
