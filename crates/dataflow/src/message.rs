//! A message moving through a dataflow.

use std::collections::BTreeMap;

use serde_json::Value;

/// Where a message goes after the transformations: the main sink or one
/// of the extra outputs a transformation declared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Output {
    #[default]
    Main,
    /// An index into the pipeline's outputs (`transforms::Outputs`).
    Route(usize),
    /// Refused by its source (it could not be decoded): the pipeline sends
    /// it to the error sink without transforming it. The reason is the
    /// metadata [`crate::message::REFUSED`].
    Refused,
}

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
