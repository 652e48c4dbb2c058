//! The DataFlow runtime's building blocks (seed 001): messages, the field
//! path and condition grammar, and the transformations. Sources, sinks and
//! the pipeline that runs them join these in the processor.

pub mod condition;
pub mod message;
pub mod path;
pub mod transforms;
