//! Sources: where a dataflow reads from.

pub mod postgres;
