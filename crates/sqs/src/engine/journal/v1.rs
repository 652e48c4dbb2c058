//! Journals of the format before (`SLESSQJ1`): records of changes to the
//! live queues and messages, with no commands and no receive state.
//! Opening such a journal reads what it holds and writes it as the first
//! snapshot of a journal of the current format.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use super::log::{Entry, LogError, V1_MAGIC, from_json, scan};
use crate::engine::records::{StoredMessage, StoredQueue};

const PUT_QUEUE: u8 = 1;
const DELETE_QUEUE: u8 = 2;
const PURGE_QUEUE: u8 = 3;
const PUT_MESSAGE: u8 = 4;
const DELETE_MESSAGE: u8 = 5;

pub type Held = (Vec<StoredQueue>, Vec<(String, u64, StoredMessage)>);

/// Whether the file at `path` is a journal of this format.
pub fn is_v1(path: &Path) -> std::io::Result<bool> {
    let mut magic = [0; 8];
    let file = std::fs::File::open(path)?;
    Ok(std::os::unix::fs::FileExt::read_exact_at(&file, &mut magic, 0).is_ok() && &magic == V1_MAGIC)
}

/// The queues and messages the journal at `path` holds, up to a torn last
/// record.
pub fn read(path: &Path) -> Result<Held, LogError> {
    let file = std::fs::File::open(path)?;
    let mut queues: HashMap<String, StoredQueue> = HashMap::new();
    let mut messages: HashMap<String, BTreeMap<u64, StoredMessage>> = HashMap::new();
    scan(&file, path, V1_MAGIC, |e: &Entry<'_>| {
        match e.tag {
            PUT_QUEUE => drop(queues.insert(e.queue.to_owned(), from_json(e.value)?)),
            DELETE_QUEUE => {
                queues.remove(e.queue);
                messages.remove(e.queue);
            }
            PURGE_QUEUE => drop(messages.remove(e.queue)),
            PUT_MESSAGE => drop(
                messages
                    .entry(e.queue.to_owned())
                    .or_default()
                    .insert(e.seq, from_json(e.value)?),
            ),
            DELETE_MESSAGE => {
                if let Some(held) = messages.get_mut(e.queue) {
                    held.remove(&e.seq);
                }
            }
            tag => return Err(format!("unknown entry tag {tag}")),
        }
        Ok(())
    })?;
    let messages = messages
        .into_iter()
        .flat_map(|(queue, held)| held.into_iter().map(move |(seq, m)| (queue.clone(), seq, m)))
        .collect();
    Ok((queues.into_values().collect(), messages))
}
