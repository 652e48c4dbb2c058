//! Prometheus families of running dataflows: messages read, written,
//! failed and filtered, and the age of the last checkpoint. Built afresh at
//! each scrape from the live counters, so a deleted dataflow disappears.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::SystemTime;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::pipeline::Stats;

/// One running dataflow. `namespace` is the tenant in `sless dev`.
pub struct FlowSample {
    pub namespace: String,
    pub dataflow: String,
    pub stats: Arc<Stats>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlowLabels {
    namespace: String,
    dataflow: String,
}

/// Appends the families (without the closing `# EOF`) to `out`.
pub fn encode(out: &mut String, flows: &[FlowSample]) -> std::fmt::Result {
    let mut registry = Registry::with_prefix("sless_dataflow");
    let counter = |registry: &mut Registry, name: &str, help: &str| {
        let family = Family::<FlowLabels, Counter>::default();
        registry.register(name, help, family.clone());
        family
    };
    let read = counter(&mut registry, "messages_read", "Records taken from the source");
    let written = counter(&mut registry, "messages_written", "Messages written to a sink");
    let failed = counter(
        &mut registry,
        "messages_failed",
        "Messages a sink refused, sent to the error sink",
    );
    let filtered = counter(&mut registry, "messages_filtered", "Records a filter dropped");
    let age = Family::<FlowLabels, Gauge<f64, AtomicU64>>::default();
    registry.register(
        "checkpoint_age_seconds",
        "Seconds since the last batch was committed to the source",
        age.clone(),
    );
    let now = SystemTime::now();
    for flow in flows {
        let labels = FlowLabels {
            namespace: flow.namespace.clone(),
            dataflow: flow.dataflow.clone(),
        };
        let c = flow.stats.snapshot();
        read.get_or_create(&labels).inc_by(c.read);
        written.get_or_create(&labels).inc_by(c.written);
        failed.get_or_create(&labels).inc_by(c.failed);
        filtered.get_or_create(&labels).inc_by(c.filtered);
        if let Some(at) = flow.stats.last_checkpoint() {
            age.get_or_create(&labels)
                .set(now.duration_since(at).unwrap_or_default().as_secs_f64());
        }
    }
    prometheus_client::encoding::text::encode_registry(out, &registry)
}

/// A whole exposition of `flows`, ending in `# EOF`.
pub fn render(flows: &[FlowSample]) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, flows).and_then(|()| prometheus_client::encoding::text::encode_eof(&mut out));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dataflow_gets_its_labelled_series() {
        let stats = Arc::new(Stats::default());
        let text = render(&[FlowSample {
            namespace: "team-a".into(),
            dataflow: "orders".into(),
            stats,
        }]);
        assert!(
            text.contains(r#"sless_dataflow_messages_read_total{namespace="team-a",dataflow="orders"} 0"#),
            "{text}"
        );
        // No batch committed yet: no age rather than a made-up one.
        assert!(!text.contains("sless_dataflow_checkpoint_age_seconds{"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }
}
