//! The worker control plane (seed 002): gateway workers register, receive
//! routing snapshots, acknowledge them and report runtime and outcomes.

pub mod model;
pub mod store;
pub mod validate;
