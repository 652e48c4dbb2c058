//! Sinks: where a dataflow writes to.

pub mod postgres;
