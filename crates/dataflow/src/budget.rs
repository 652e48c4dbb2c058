//! What the dataflows of one process may take together, per tenant and in
//! all: bytes on disk for what a connector keeps beyond memory (a CDC
//! source's streamed transactions) and bytes of answers held in memory (a
//! ClickHouse source's). A flow over a bound gets an error naming it, which
//! its status shows, and retries; the other tenants' flows go on.
//!
//! Each dataflow spills into a directory of its own under the process's
//! spill root: emptied when its source opens (what a crash left there is
//! nobody's now) and removed with the dataflow.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};
use sless_runtime::sync::Unpoisoned;

use crate::ConnectorError;

const MIB: u64 = 1 << 20;

const SPILL_MB: u64 = 8192;
const TENANT_SPILL_MB: u64 = 4096;
const MEMORY_MB: u64 = 2048;
const TENANT_MEMORY_MB: u64 = 512;

/// The bounds, in MiB, as `sless dev` and `sless processor` take them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct BudgetArgs {
    /// MiB the dataflows of this process may keep on disk together
    /// (streamed transactions of CDC sources).
    #[arg(long = "spill-limit-mb", default_value_t = SPILL_MB)]
    pub spill_mb: u64,
    /// MiB one tenant's dataflows may keep on disk together.
    #[arg(long = "tenant-spill-limit-mb", default_value_t = TENANT_SPILL_MB)]
    pub tenant_spill_mb: u64,
    /// MiB of answers (a ClickHouse source's) the dataflows of this process
    /// may hold in memory at once.
    #[arg(long = "dataflow-memory-limit-mb", default_value_t = MEMORY_MB)]
    pub memory_mb: u64,
    /// MiB of answers one tenant's dataflows may hold in memory at once.
    #[arg(long = "tenant-dataflow-memory-limit-mb", default_value_t = TENANT_MEMORY_MB)]
    pub tenant_memory_mb: u64,
}

impl Default for BudgetArgs {
    fn default() -> Self {
        Self {
            spill_mb: SPILL_MB,
            tenant_spill_mb: TENANT_SPILL_MB,
            memory_mb: MEMORY_MB,
            tenant_memory_mb: TENANT_MEMORY_MB,
        }
    }
}

/// One bound: bytes taken of a limit.
struct Meter {
    limit: u64,
    used: AtomicU64,
}

impl Meter {
    fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicU64::new(0),
        })
    }

    fn try_take(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|after| *after <= self.limit)
            })
            .is_ok()
    }

    fn give(&self, bytes: u64) {
        let _ = self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            Some(used.saturating_sub(bytes))
        });
    }
}

/// What a resource is, for errors: "on disk for streamed transactions".
#[derive(Debug, Clone, Copy)]
enum Kind {
    Spill,
    Memory,
}

impl Kind {
    fn held(self) -> &'static str {
        match self {
            Self::Spill => "keep on disk (streamed transactions)",
            Self::Memory => "hold in memory (answers being read)",
        }
    }

    fn flags(self) -> (&'static str, &'static str) {
        match self {
            Self::Spill => ("--tenant-spill-limit-mb", "--spill-limit-mb"),
            Self::Memory => ("--tenant-dataflow-memory-limit-mb", "--dataflow-memory-limit-mb"),
        }
    }
}

/// One resource's meters: the process's, and each tenant's.
struct Meters {
    kind: Kind,
    process: Arc<Meter>,
    tenant_limit: u64,
    tenants: Mutex<HashMap<String, Arc<Meter>>>,
}

impl Meters {
    fn new(kind: Kind, process_mb: u64, tenant_mb: u64) -> Self {
        Self {
            kind,
            process: Meter::new(process_mb.saturating_mul(MIB)),
            tenant_limit: tenant_mb.saturating_mul(MIB),
            tenants: Mutex::default(),
        }
    }

    fn for_tenant(&self, tenant: &str) -> Allowance {
        let tenant_meter = self
            .tenants
            .lock_unpoisoned()
            .entry(tenant.to_owned())
            .or_insert_with(|| Meter::new(self.tenant_limit))
            .clone();
        Allowance {
            kind: self.kind,
            tenant: tenant_meter,
            process: self.process.clone(),
        }
    }
}

/// What the dataflows of one process may take.
pub struct Budgets {
    spill_root: PathBuf,
    spill: Meters,
    memory: Meters,
}

impl Budgets {
    /// Bounds of `args`, spilling under `spill_root`.
    pub fn new(spill_root: PathBuf, args: BudgetArgs) -> Arc<Self> {
        Arc::new(Self {
            spill_root,
            spill: Meters::new(Kind::Spill, args.spill_mb, args.tenant_spill_mb),
            memory: Meters::new(Kind::Memory, args.memory_mb, args.tenant_memory_mb),
        })
    }

    /// The budget of the dataflow `id` of `tenant` (what
    /// [`crate::context::PipelineContext`] names them).
    pub fn for_flow(&self, tenant: &str, id: &str) -> FlowBudget {
        FlowBudget {
            spill_dir: spill_dir(&self.spill_root, id),
            spill: self.spill.for_tenant(tenant),
            memory: self.memory.for_tenant(tenant),
        }
    }
}

/// A dataflow's directory under `root`: named by a digest of its id, so
/// any id makes one plain name.
pub fn spill_dir(root: &std::path::Path, id: &str) -> PathBuf {
    root.join(sless_runtime::hex::encode(&Sha256::digest(id.as_bytes())[..12]))
}

/// One dataflow's share of a resource: its tenant's meter and the
/// process's.
#[derive(Clone)]
pub struct Allowance {
    kind: Kind,
    tenant: Arc<Meter>,
    process: Arc<Meter>,
}

impl std::fmt::Debug for Allowance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allowance")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl Allowance {
    /// Takes `bytes`, or says which bound they would pass.
    pub fn take(&self, bytes: u64) -> Result<(), ConnectorError> {
        let (tenant_flag, process_flag) = self.kind.flags();
        if !self.tenant.try_take(bytes) {
            return Err(ConnectorError::Transient(format!(
                "the tenant's dataflows may {} at most {} MiB together ({tenant_flag}), which this would pass",
                self.kind.held(),
                self.tenant.limit / MIB
            )));
        }
        if !self.process.try_take(bytes) {
            self.tenant.give(bytes);
            return Err(ConnectorError::Transient(format!(
                "this platform's dataflows may {} at most {} MiB together ({process_flag}), which this would pass",
                self.kind.held(),
                self.process.limit / MIB
            )));
        }
        Ok(())
    }

    /// Gives back `bytes` taken before.
    pub fn give(&self, bytes: u64) {
        self.tenant.give(bytes);
        self.process.give(bytes);
    }

    /// Takes `bytes` until the [`Held`] drops.
    pub fn hold(&self, bytes: u64) -> Result<Held, ConnectorError> {
        self.take(bytes)?;
        Ok(Held {
            allowance: self.clone(),
            bytes,
        })
    }
}

/// Bytes held of an [`Allowance`], given back on drop.
pub struct Held {
    allowance: Allowance,
    bytes: u64,
}

impl Held {
    /// Holds `bytes` more.
    pub fn grow(&mut self, bytes: u64) -> Result<(), ConnectorError> {
        self.allowance.take(bytes)?;
        self.bytes += bytes;
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.allowance.give(self.bytes);
    }
}

/// One dataflow's budget.
#[derive(Clone, Debug)]
pub struct FlowBudget {
    /// Its own directory to spill into.
    pub spill_dir: PathBuf,
    pub spill: Allowance,
    pub memory: Allowance,
}

impl FlowBudget {
    /// A budget of its own (the defaults' process bounds) under the
    /// system's temporary directory: for tests, benches and the operator's
    /// release of a deleted dataflow's state (which spills nothing).
    pub fn temporary() -> Self {
        let root = std::env::temp_dir().join(format!("sless-spill-{}", rand::random::<u64>()));
        Budgets::new(root, BudgetArgs::default()).for_flow("temporary", "temporary")
    }

    /// Removes the dataflow's spill directory: when its source opens (what
    /// an earlier run left there, after a crash, is nobody's now) and when
    /// the dataflow is deleted. It is made again when needed.
    pub async fn remove_spill(&self) -> Result<(), ConnectorError> {
        let dir = self.spill_dir.clone();
        tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
        .await
        .map_err(|e| ConnectorError::Transient(format!("the dataflow's spill directory: {e}")))?
        .map_err(|e| ConnectorError::Transient(format!("cannot remove the dataflow's spill directory: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_and_the_process_are_bounded_each() {
        let budgets = Budgets::new(
            PathBuf::from("/nowhere"),
            BudgetArgs {
                spill_mb: 3,
                tenant_spill_mb: 2,
                ..BudgetArgs::default()
            },
        );
        let (a1, a2, b) = (
            budgets.for_flow("a", "a/one"),
            budgets.for_flow("a", "a/two"),
            budgets.for_flow("b", "b/one"),
        );
        a1.spill.take(MIB).unwrap();
        a2.spill.take(MIB).unwrap();
        let e = a2.spill.take(1).unwrap_err().to_string();
        assert!(e.contains("tenant's dataflows") && e.contains("at most 2 MiB"), "{e}");
        b.spill.take(MIB).unwrap();
        let e = b.spill.take(1).unwrap_err().to_string();
        assert!(e.contains("platform's dataflows") && e.contains("at most 3 MiB"), "{e}");
        // A refusal by the process took nothing of the tenant's.
        a1.spill.give(MIB);
        b.spill.take(MIB).unwrap();
        // Memory is held until dropped.
        let held = b.memory.hold(512 * MIB).unwrap();
        assert!(b.memory.take(1).is_err());
        drop(held);
        b.memory.take(1).unwrap();
        assert_ne!(a1.spill_dir, a2.spill_dir);
        assert!(a1.spill_dir.starts_with("/nowhere"));
    }
}
