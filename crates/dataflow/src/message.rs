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

impl Message {
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
