//! Keeps one dataflow running until it is stopped: connects its pipeline,
//! runs it, and after a failure connects again with backoff (1 s doubling
//! to 30 s), reporting each phase. `sless dev` and `sless processor` both
//! run their dataflows through it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::pipeline::{Pipeline, PipelineContext, Stats};
use crate::model::Phase;
use crate::model::dataflow::DataFlowSpec;

pub async fn supervise(
    spec: DataFlowSpec,
    ctx: PipelineContext,
    stats: Arc<Stats>,
    mut stopped: watch::Receiver<bool>,
    report: impl Fn(Phase, String) + Send,
) {
    let mut delay = Duration::from_secs(1);
    while !*stopped.borrow() {
        match Pipeline::connect(&spec, &ctx, stats.clone()).await {
            Ok(pipeline) => {
                report(Phase::Ready, "running".into());
                delay = Duration::from_secs(1);
                if let Err(e) = pipeline.run(stopped.clone()).await {
                    tracing::warn!(dataflow = %ctx.id, error = %e, "dataflow stopped");
                    report(Phase::Failed, format!("processor stopped: {e}; restarting"));
                }
            }
            Err(e) => {
                tracing::warn!(dataflow = %ctx.id, error = %e, "dataflow cannot start");
                report(Phase::Failed, format!("{e}; retrying"));
            }
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stopped.wait_for(|s| *s) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}
