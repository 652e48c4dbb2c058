//! Black-box and integration tests of `sless`, in one test binary: every
//! module here used to be a binary of its own, each linking the whole
//! service, kube and librdkafka again.

mod common;

mod api;
mod attacks;
mod cli;
mod controlplane;
mod controlplane_faults;
mod controlplane_tls;
mod dataflow_kafka;
mod dataflow_pg;
mod dev_routing;
mod gateway;
mod generated_objects;
mod processor;
mod restart;
mod webhook;
