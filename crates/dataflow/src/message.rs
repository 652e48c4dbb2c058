//! A message moving through a dataflow.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::transforms::Output;

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The payload, a JSON value (a row or a decoded record).
    pub data: Value,
    /// Annotations such as `routed_condition`, set by the router.
    pub metadata: BTreeMap<String, String>,
    /// Where the pipeline writes it.
    pub output: Output,
}

/// The metadata key of the reason a source refused a message.
pub const REFUSED: &str = "refused";

impl Message {
    /// A message its source could not decode, kept whole for the error sink.
    pub fn refused(data: Value, reason: String) -> Self {
        let mut message = Self::new(data);
        message.metadata.insert(REFUSED.into(), reason);
        message.output = Output::Refused;
        message
    }

    pub fn new(data: Value) -> Self {
        Self {
            data,
            metadata: BTreeMap::new(),
            output: Output::Main,
        }
    }

    /// About how many bytes of memory the message holds: what the
    /// pipeline's memory budget counts.
    pub fn approx_size(&self) -> usize {
        value_size(&self.data)
            + self
                .metadata
                .iter()
                .map(|(k, v)| ENTRY_SIZE + k.len() + v.len())
                .sum::<usize>()
    }

    /// A message with new data and this one's metadata.
    pub fn with_data(&self, data: Value) -> Self {
        Self {
            data,
            metadata: self.metadata.clone(),
            output: self.output,
        }
    }
}

/// A JSON value's own size, and a map entry's beside its key and value.
pub const VALUE_SIZE: usize = std::mem::size_of::<Value>();
pub const ENTRY_SIZE: usize = 48;

/// About how many bytes `value` holds in memory.
pub fn value_size(value: &Value) -> usize {
    VALUE_SIZE
        + match value {
            Value::String(s) => s.len(),
            Value::Array(items) => items.iter().map(value_size).sum(),
            Value::Object(map) => map.iter().map(|(k, v)| ENTRY_SIZE + k.len() + value_size(v)).sum(),
            Value::Null | Value::Bool(_) | Value::Number(_) => 0,
        }
}
