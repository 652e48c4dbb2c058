//! The worker control plane (seed 002): gateway workers register, receive
//! routing snapshots, acknowledge them and report runtime and outcomes.

pub mod codec;
pub mod config;
pub mod grpc;
pub mod identity;
pub mod local_pki;
pub mod model;
pub mod proto;
pub mod publisher;
pub mod server;
pub mod store;
pub mod validate;
mod watch;
pub mod worker;
