//! Code generated from `proto/controlplane/v1/controlplane.proto`.

#![allow(clippy::all, clippy::pedantic, missing_docs)]

tonic::include_proto!("sless.controlplane.v1");
