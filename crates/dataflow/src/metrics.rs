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

use sless_model::dataflow::DataFlowCounters;

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

/// Most bytes of a processor's exposition [`counters_of`] reads: one
/// dataflow's families are well under a kilobyte.
pub const MAX_EXPOSITION_BYTES: usize = 64 * 1024;

/// The counters of `dataflow` in an exposition [`render`] made (a
/// processor's `/metrics`), the checkpoint age turned into a time as of
/// `now`; `None` when the dataflow has no series there.
pub fn counters_of(text: &str, dataflow: &str, now: SystemTime) -> Option<DataFlowCounters> {
    let label = format!("dataflow=\"{dataflow}\"");
    let mut counters = DataFlowCounters::default();
    let mut seen = false;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, rest)) = line.split_once('{') else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        if !labels.split(',').any(|l| l == label) {
            continue;
        }
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let count = value as u64;
        match name.strip_prefix("sless_dataflow_") {
            Some("messages_read_total") => counters.read = count,
            Some("messages_written_total") => counters.written = count,
            Some("messages_failed_total") => counters.failed = count,
            Some("messages_filtered_total") => counters.filtered = count,
            Some("checkpoint_age_seconds") if value.is_finite() && value >= 0.0 => {
                let at = now
                    .checked_sub(std::time::Duration::from_secs_f64(value))
                    .unwrap_or(now);
                counters.last_checkpoint_at = Some(humantime::format_rfc3339_seconds(at).to_string());
            }
            _ => continue,
        }
        seen = true;
    }
    seen.then_some(counters)
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

    #[test]
    fn the_counters_come_back_from_the_exposition() {
        let stats = Arc::new(Stats::default());
        stats.count_for_test(7, 5, 1, 1);
        let sample = |dataflow: &str| FlowSample {
            namespace: "sless-fn-a".into(),
            dataflow: dataflow.into(),
            stats: stats.clone(),
        };
        let text = render(&[sample("other"), sample("orders")]);
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let got = counters_of(&text, "orders", now).unwrap();
        assert_eq!((got.read, got.written, got.failed, got.filtered), (7, 5, 1, 1));
        assert_eq!(got.last_checkpoint_at, None, "no batch committed yet");
        assert_eq!(counters_of(&text, "order", now), None, "a name is matched whole");
        assert_eq!(counters_of("garbage {{}} x\n} 1", "orders", now), None);
        let aged = "sless_dataflow_checkpoint_age_seconds{namespace=\"n\",dataflow=\"orders\"} 30.0\n";
        assert_eq!(
            counters_of(aged, "orders", now).unwrap().last_checkpoint_at.as_deref(),
            Some("2027-01-15T07:59:30Z")
        );
    }
}
