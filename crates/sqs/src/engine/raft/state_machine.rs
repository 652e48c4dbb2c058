//! A replica's state machine: the engine's [`Machine`], with the position
//! in the log it has applied up to and the membership it last applied,
//! under one lock, so a snapshot is of one consistent point. A snapshot is
//! a file in the journal's snapshot format (`journal::log`) whose meta is
//! openraft's; followers receive the same file, in chunks.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership,
};
use sless_runtime::sync::Unpoisoned;

use super::{Failure, NodeId, Outcome, TypeConfig};
use crate::engine::journal::log::{read_snapshot_file, read_snapshot_meta, sync_dir, write_snapshot_file};
use crate::engine::journal::sibling;
use crate::engine::machine::{Identity, Machine};

type Error = StorageError<NodeId>;
type Meta = SnapshotMeta<NodeId, BasicNode>;

/// The machine and how far into the log it is. It reads as the machine.
pub struct Applied {
    pub machine: Machine,
    pub last: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, BasicNode>,
}

impl Applied {
    /// `machine`, at the log's start.
    pub fn new(machine: Machine) -> Self {
        Self {
            machine,
            last: None,
            membership: StoredMembership::default(),
        }
    }
}

impl std::ops::Deref for Applied {
    type Target = Machine;

    fn deref(&self) -> &Machine {
        &self.machine
    }
}

impl std::ops::DerefMut for Applied {
    fn deref_mut(&mut self) -> &mut Machine {
        &mut self.machine
    }
}

/// A replica's state machine. Clones share it: the engine reads the
/// machine through [`StateMachine::lock`].
#[derive(Clone)]
pub struct StateMachine {
    applied: Arc<Mutex<Applied>>,
    identity: Identity,
    /// The current snapshot's file.
    snapshot: PathBuf,
}

impl StateMachine {
    /// The state machine of the replica whose files are in `dir`: its
    /// snapshot's state, if it has one (the log after it is applied again
    /// by openraft).
    pub fn open(dir: &Path, identity: Identity) -> Result<Self, Error> {
        let snapshot = dir.join("raft.snapshot");
        let applied = if snapshot.exists() {
            let (meta, machine) = read(&snapshot, identity.clone())?;
            Applied {
                machine,
                last: meta.last_log_id,
                membership: meta.last_membership,
            }
        } else {
            Applied::new(Machine::new(identity.clone()))
        };
        Ok(Self {
            applied: Arc::new(Mutex::new(applied)),
            identity,
            snapshot,
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, Applied> {
        self.applied.lock_unpoisoned()
    }

    pub fn snapshot_path(&self) -> PathBuf {
        self.snapshot.clone()
    }

    /// The state, for readers beside the replica.
    pub fn shared(&self) -> Arc<Mutex<Applied>> {
        self.applied.clone()
    }

    fn meta_of(applied: &Applied) -> Meta {
        let last = applied.last;
        SnapshotMeta {
            last_log_id: last,
            last_membership: applied.membership.clone(),
            snapshot_id: last.map_or_else(|| "none".to_owned(), |l| format!("{}-{}", l.leader_id, l.index)),
        }
    }

    async fn open_snapshot(&self) -> Result<Option<Snapshot<TypeConfig>>, Error> {
        if !self.snapshot.exists() {
            return Ok(None);
        }
        // One handle for the meta and the data: a snapshot replacing the
        // file meanwhile cannot pair one's meta with the other's data.
        let file = std::fs::File::open(&self.snapshot).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        let meta = read_snapshot_meta(&file, &self.snapshot).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        let meta: Meta = serde_json::from_slice(&meta).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        }))
    }
}

fn read(path: &Path, identity: Identity) -> Result<(Meta, Machine), Error> {
    let (meta, machine) = read_snapshot_file(path, identity).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
    let meta = serde_json::from_slice(&meta).map_err(|e| StorageIOError::read_snapshot(None, &e))?;
    Ok((meta, machine))
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    /// Writes the machine as it is now; applying waits meanwhile.
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, Error> {
        let meta = {
            let applied = self.lock();
            let meta = Self::meta_of(&applied);
            let bytes = serde_json::to_vec(&meta).map_err(|e| StorageIOError::write_snapshot(None, &e))?;
            write_snapshot_file(&self.snapshot, &bytes, &applied.machine)
                .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
            meta
        };
        let file = tokio::fs::File::open(&self.snapshot)
            .await
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(file),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), Error> {
        let applied = self.lock();
        Ok((applied.last, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcome>, Error>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut applied = self.lock();
        let outcomes = entries
            .into_iter()
            .map(|entry| {
                applied.last = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Blank => Outcome::default(),
                    EntryPayload::Normal(commands) => {
                        Outcome(commands.0.into_iter().map(|c| applied.machine.apply(c)).collect())
                    }
                    EntryPayload::Membership(membership) => {
                        applied.membership = StoredMembership::new(Some(entry.log_id), membership);
                        Outcome::default()
                    }
                }
            })
            .collect();
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, Error> {
        let incoming = sibling(&self.snapshot, "-incoming");
        let file = tokio::fs::File::create(&incoming)
            .await
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        Ok(Box::new(file))
    }

    /// Takes the snapshot a leader sent (the file [`Self::begin_receiving_snapshot`]
    /// made): it becomes this replica's snapshot and state.
    async fn install_snapshot(&mut self, meta: &Meta, snapshot: Box<tokio::fs::File>) -> Result<(), Error> {
        let failed =
            |e: &dyn std::error::Error| StorageIOError::write_snapshot(Some(meta.signature()), &Failure(e.to_string()));
        snapshot.sync_all().await.map_err(|e| failed(&e))?;
        drop(snapshot);
        let incoming = sibling(&self.snapshot, "-incoming");
        let (sent, machine) = read(&incoming, self.identity.clone())?;
        if sent.last_log_id != meta.last_log_id {
            return Err(failed(&Failure(format!(
                "the snapshot received is of {:?}, not of {:?}",
                sent.last_log_id, meta.last_log_id
            )))
            .into());
        }
        // Under the machine's lock, as a snapshot being built replaces the
        // file under it: one replaces the file after the other, never a
        // newer one with an older.
        let mut applied = self.lock();
        std::fs::rename(&incoming, &self.snapshot)
            .and_then(|()| sync_dir(&self.snapshot))
            .map_err(|e| failed(&e))?;
        *applied = Applied {
            machine,
            last: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, Error> {
        self.open_snapshot().await
    }
}
