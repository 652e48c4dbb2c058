//! The worker control plane over real gRPC sockets: its RPC semantics, the
//! Redis store under faults, and mutual TLS with certificates made at test
//! time. One binary, linking only the control plane and the test kit.

mod faults;
mod service;
mod tls;
