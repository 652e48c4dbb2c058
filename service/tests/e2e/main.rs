//! Black-box tests of the `sless` binary (`sless dev`, `sless processor`,
//! the CLI), in one test binary. Tests of one crate live in that crate:
//! the control plane's in `crates/controlplane/tests`, the gateway's in
//! `crates/sqs/tests`, the operator's in `crates/operator/tests`.

mod common;

mod api;
mod attacks;
mod cli;
mod connections;
mod dataflow_avro;
mod dataflow_cdc;
mod dataflow_cdc_apply;
mod dataflow_clickhouse;
mod dataflow_kafka;
mod dataflow_nessie;
mod dataflow_pg;
mod dataflow_sqs;
mod dataflow_trino;
mod dev_replicas;
mod dev_routing;
mod exactly_once;
mod kubernetes;
mod kubernetes_wire;
mod processor;
mod processor_status;
mod replicas;
mod restart;
