//! The operator's objects from outside the crate: the generated Kubernetes
//! objects checked by a schema validator, and the admission webhook over
//! real TLS. One binary, linking the operator and the test kit.

mod generated;
mod webhook;
