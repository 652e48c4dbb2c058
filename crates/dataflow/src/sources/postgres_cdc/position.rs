//! Where a change of a `postgresql-cdc` source is in commit order, as the
//! pipeline's positions carry it and an exactly-once sink stores it.

use super::pgoutput::{lsn_text, parse_lsn};
use crate::sources::Position;

/// Where a change is in commit order: its transaction's commit LSN and its
/// place in the transaction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Order {
    pub(super) commit: u64,
    pub(super) index: u32,
}

/// The order of the last change among `done` (snapshot rows have none).
pub(super) fn last_change(done: &[Position]) -> Option<Order> {
    done.iter().rev().find_map(|p| match *p {
        Position::Change { commit, index, .. } => Some(Order { commit, index }),
        _ => None,
    })
}

impl Order {
    /// The position of the change at this order, which confirms `confirms`.
    pub(super) fn position(self, confirms: u64) -> Position {
        Position::Change {
            confirms,
            commit: self.commit,
            index: self.index,
        }
    }

    /// As an exactly-once sink stores it.
    pub(super) fn text(self) -> String {
        format!("cdc:{}:{}", lsn_text(self.commit), self.index)
    }

    pub(super) fn parse(text: &str) -> Option<Self> {
        let (commit, index) = text.strip_prefix("cdc:")?.rsplit_once(':')?;
        Some(Self {
            commit: parse_lsn(commit)?,
            index: index.parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn change_orders_round_trip_and_sort_by_commit_then_index() {
        let a = Order {
            commit: 0x1_0000_0010,
            index: 7,
        };
        assert_eq!(Order::parse(&a.text()), Some(a));
        assert!(
            a < Order {
                commit: a.commit,
                index: 8
            }
        );
        assert!(
            Order {
                commit: 0x20,
                index: 99
            } < a
        );
        for bad in ["", "cdc:", "cdc:1/2", "cdc:x/2:3", "kafka:1/2:3", "cdc:1/2:-1"] {
            assert_eq!(Order::parse(bad), None, "{bad}");
        }
        let source_done = [
            Position::SnapshotRow { last: true },
            Position::Change {
                confirms: 5,
                commit: 0x30,
                index: 1,
            },
            Position::SnapshotRow { last: false },
        ];
        assert_eq!(
            last_change(&source_done).map(Order::text).as_deref(),
            Some("cdc:0/30:1")
        );
        assert_eq!(last_change(&source_done[..1]), None, "snapshot rows store no position");
    }
}
