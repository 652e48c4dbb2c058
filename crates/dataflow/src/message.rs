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

    /// A message with new data and this one's metadata.
    pub fn with_data(&self, data: Value) -> Self {
        Self {
            data,
            metadata: self.metadata.clone(),
            output: self.output,
        }
    }
}
