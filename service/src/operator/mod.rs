//! Kubernetes mode (seeds 000 and 001): the custom resources QueueService
//! and DataFlow. Their generated CustomResourceDefinitions are committed
//! under `deploy/crds/` and printed by `sless crds`.

pub mod crd;
