//! Keeps one dataflow running until it is stopped: connects its pipeline,
//! runs it, and after a failure connects again with backoff (1 s doubling
//! to 30 s), reporting each phase. `sless dev` and `sless processor` both
//! run their dataflows through it.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::watch;

use crate::ConnectorError;
use crate::context::PipelineContext;
use crate::pipeline::{Pipeline, Refusal, Stats};
use sless_model::dataflow::DataFlowPhase;
use sless_model::dataflow::DataFlowSpec;
use sless_runtime::backoff::Backoff;

/// How often a running flow's refusals and read failures are looked at.
const REFUSAL_CHECK: Duration = Duration::from_millis(500);

/// Restarts of a failed pipeline: after 1 s, doubling to 30 s.
const RESTART: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

/// A panic of a pipeline (a defect): logged with its text, which may hold
/// the data it met; the status says only that it happened.
fn panicked(dataflow: &str, panic: Box<dyn std::any::Any + Send>) -> ConnectorError {
    let text = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    tracing::error!(%dataflow, panic = text, "the dataflow's pipeline panicked");
    ConnectorError::Transient("the processor failed unexpectedly (a defect, in its log)".into())
}

fn refusal_message(r: &Refusal) -> String {
    format!(
        "{} refuses a message ({}) and there is no error sink: retrying it; refused {} time(s) so far",
        r.target, r.reason, r.count
    )
}

pub async fn supervise(
    spec: DataFlowSpec,
    ctx: PipelineContext,
    stats: Arc<Stats>,
    mut stopped: watch::Receiver<bool>,
    report: impl Fn(DataFlowPhase, String) + Send,
) {
    let mut retries = RESTART.start();
    while !*stopped.borrow() {
        let connected = AssertUnwindSafe(Pipeline::connect(&spec, &ctx, stats.clone()))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Err(panicked(&ctx.id, panic)));
        match connected {
            Ok(pipeline) => {
                report(DataFlowPhase::Running, "running".into());
                retries.succeeded();
                // A panic ends the run as a failure, restarted like any other.
                let run = AssertUnwindSafe(pipeline.run(stopped.clone()))
                    .catch_unwind()
                    .map(|ran| ran.unwrap_or_else(|panic| Err(panicked(&ctx.id, panic))));
                tokio::pin!(run);
                // A refused message, or a read or write retried, stalls the
                // flow without failing it: show it.
                let mut shown = (None, None, None);
                let mut check = tokio::time::interval(REFUSAL_CHECK);
                let outcome = loop {
                    tokio::select! {
                        outcome = &mut run => break outcome,
                        _ = check.tick() => {
                            let now = (stats.refusal(), stats.write_failure(), stats.read_failure());
                            if now != shown {
                                match &now {
                                    (Some(r), ..) => report(DataFlowPhase::Error, refusal_message(r)),
                                    (None, Some(failure), _) => {
                                        report(DataFlowPhase::Error, format!("{failure}; retrying"))
                                    }
                                    (None, None, Some(failure)) => report(
                                        DataFlowPhase::Error,
                                        format!("reading the source fails: {failure}; retrying"),
                                    ),
                                    (None, None, None) => report(DataFlowPhase::Running, "running".into()),
                                }
                                shown = now;
                            }
                        }
                    }
                };
                if let Err(e) = outcome {
                    tracing::warn!(dataflow = %ctx.id, error = %e, "dataflow stopped");
                    // A lost connection after a failing write: the write's
                    // reason is the one the tenant can act on.
                    let after = stats.write_failure().map(|w| format!(" ({w})")).unwrap_or_default();
                    report(
                        DataFlowPhase::Error,
                        format!("processor stopped: {e}{after}; restarting"),
                    );
                }
            }
            Err(e) => {
                tracing::warn!(dataflow = %ctx.id, error = %e, "dataflow cannot start");
                report(DataFlowPhase::Error, format!("{e}; retrying"));
            }
        }
        retries.wait(&mut stopped).await;
    }
}
