//! A noisy tenant beside a quiet one: what the gateway's per-tenant rate
//! spares the quiet tenant, as a ratio to the quiet tenant alone in the
//! same run.
//!
//! `sless dev --tenant-requests-per-second 200` with two tenants, an
//! in-memory queue service each. The quiet tenant sends a message every
//! 10 ms (half its rate) on a schedule that does not wait for answers (so a
//! slow answer delays no later send); each latency counts from the send,
//! and how late the schedule ran is printed beside. Each round runs the
//! quiet tenant alone and beside the noisy tenant offering 2,000 sends a
//! second (10x its rate, paced likewise, from a thread of its own), all but
//! its rate answered RequestThrottled; rounds alternate which comes first.
//! Goal: the quiet tenant's p99 beside the noisy one within 1.10x of its
//! p99 alone (the median of the rounds' ratios). For contrast, one round
//! more once the noisy tenant's queue service asks for 100,000 a second
//! (`PATCH requestsPerSecond`): the load the limit keeps off. The load
//! generators share the two cores with `sless dev`, as a neighbour's
//! clients would not: what they cost is in both sides of the ratio.
//!
//! Run: `cargo bench -p sless --bench noisy`. `SLESS_BENCH_SECONDS` sets
//! each run's length (10, at most 240: a run replays one signature, which
//! is good for five minutes).

// A benchmark's output is its figures, on stdout.
#![allow(clippy::print_stdout)]

#[path = "support.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use reqwest::header::HeaderMap;
use serde_json::json;
use sless_sqs::sigv4;
use support::DevTenant;

/// The gateways' requests a second per tenant.
const LIMIT: u32 = 200;
const QUIET_PER_SECOND: u32 = LIMIT / 2;
const NOISY_PER_SECOND: u32 = 10 * LIMIT;
/// Alternating rounds of the quiet tenant alone and beside the noisy one.
const ROUNDS: usize = 3;

fn seconds() -> Duration {
    let seconds = std::env::var("SLESS_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    Duration::from_secs(seconds.min(240))
}

/// A SendMessage signed for a tenant's queue, replayed for a whole run.
struct Signed {
    url: String,
    headers: HeaderMap,
    body: String,
}

fn send_message(tenant: &DevTenant) -> anyhow::Result<Signed> {
    let body =
        json!({"QueueUrl": tenant.queue, "MessageBody": "a benchmark message of a typical size, 64 bytes"}).to_string();
    let headers = sigv4::signed_json_headers(
        &tenant.endpoint,
        "SendMessage",
        body.as_bytes(),
        &tenant.access,
        &tenant.secret,
        sless_sqs::DEFAULT_REGION,
    )
    .context("signing")?;
    Ok(Signed {
        url: tenant.endpoint.clone(),
        headers,
        body,
    })
}

/// What a paced run saw.
#[derive(Default)]
struct Outcomes {
    /// Of the sends answered 200.
    latencies: Vec<Duration>,
    throttled: usize,
    failed: usize,
    /// How late the latest send left after it was due.
    late: Duration,
}

impl Outcomes {
    /// The latency at quantile `q`, in ms ([`paced`] sorts them).
    fn quantile_ms(&self, q: f64) -> f64 {
        let at = ((self.latencies.len() as f64 * q).ceil() as usize).clamp(1, self.latencies.len().max(1)) - 1;
        self.latencies.get(at).map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
    }
}

/// Sends `request` `per_second` times a second for `length`, each once it
/// is due (on a 1 ms tick) whether or not the earlier ones were answered.
async fn paced(request: Arc<Signed>, per_second: u32, length: Duration) -> anyhow::Result<Outcomes> {
    let client = reqwest::Client::new();
    let started = Instant::now();
    let rate = f64::from(per_second);
    let total = (length.as_secs_f64() * rate) as u64;
    let mut sends = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let (mut sent, mut late) = (0, Duration::ZERO);
    while sent < total {
        tick.tick().await;
        // Send i is due at i / rate: those due by now, the one due now too.
        let due_now = ((started.elapsed().as_secs_f64() * rate) as u64 + 1).min(total);
        for i in sent..due_now {
            let due = started + Duration::from_secs_f64(i as f64 / rate);
            late = late.max(due.elapsed());
            let (client, request) = (client.clone(), request.clone());
            sends.spawn(async move {
                let sent = Instant::now();
                let answer = client
                    .post(&request.url)
                    .headers(request.headers.clone())
                    .body(request.body.clone())
                    .send()
                    .await;
                let outcome = match answer {
                    Ok(r) if r.status().is_success() => Ok(()),
                    Ok(r) => Err(r.text().await.unwrap_or_default()),
                    Err(e) => Err(e.to_string()),
                };
                (outcome, sent.elapsed())
            });
        }
        sent = due_now;
    }
    let mut outcomes = Outcomes {
        late,
        ..Outcomes::default()
    };
    while let Some(joined) = sends.join_next().await {
        match joined? {
            (Ok(()), took) => outcomes.latencies.push(took),
            (Err(text), _) if text.contains("RequestThrottled") => outcomes.throttled += 1,
            (Err(_), _) => outcomes.failed += 1,
        }
    }
    outcomes.latencies.sort();
    Ok(outcomes)
}

/// The noisy tenant's run, on a thread and a runtime of its own so that
/// its client's work does not delay the quiet tenant's sends in this one.
fn noisy_run(request: Arc<Signed>, length: Duration) -> std::thread::JoinHandle<anyhow::Result<Outcomes>> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(paced(request, NOISY_PER_SECOND, length))
    })
}

/// The quiet tenant alone and beside the noisy one (that first if
/// `beside_first`): the quiet runs' outcomes and the noisy one's.
async fn round(
    quiet: &DevTenant,
    noisy: &DevTenant,
    beside_first: bool,
) -> anyhow::Result<(Outcomes, Outcomes, Outcomes)> {
    let length = seconds();
    let alone = || async { paced(Arc::new(send_message(quiet)?), QUIET_PER_SECOND, length).await };
    let beside = || async {
        let other = noisy_run(Arc::new(send_message(noisy)?), length);
        let beside = paced(Arc::new(send_message(quiet)?), QUIET_PER_SECOND, length).await?;
        let noise = other
            .join()
            .map_err(|_| anyhow::anyhow!("the noisy tenant's thread panicked"))??;
        anyhow::Ok((beside, noise))
    };
    let (alone, (beside, noise)) = if beside_first {
        let both = beside().await?;
        (alone().await?, both)
    } else {
        (alone().await?, beside().await?)
    };
    for (what, run) in [("alone", &alone), ("beside", &beside)] {
        if run.failed > 0 || run.throttled > 0 {
            bail!(
                "the quiet tenant {what}: {} sends failed and {} were throttled",
                run.failed,
                run.throttled
            );
        }
    }
    Ok((alone, beside, noise))
}

fn report(alone: &Outcomes, beside: &Outcomes, noise: &Outcomes) -> f64 {
    let ratio = beside.quantile_ms(0.99) / alone.quantile_ms(0.99);
    println!(
        "  quiet p99 {:.2} ms alone, {:.2} ms beside the noisy tenant = {ratio:.2} (p50 {:.2} / {:.2} ms, \
         schedule late by {:.1} / {:.1} ms at most); noisy: {} passed, {} throttled, {} failed, p99 {:.2} ms",
        alone.quantile_ms(0.99),
        beside.quantile_ms(0.99),
        alone.quantile_ms(0.5),
        beside.quantile_ms(0.5),
        alone.late.as_secs_f64() * 1e3,
        beside.late.as_secs_f64() * 1e3,
        noise.latencies.len(),
        noise.throttled,
        noise.failed,
        noise.quantile_ms(0.99),
    );
    ratio
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("sless-bench-noisy-{}", std::process::id()));
    let limit = LIMIT.to_string();
    let (process, api, tenants) =
        support::dev(&dir, &["--tenant-requests-per-second", &limit], &["quiet", "noisy"]).await?;
    let [quiet, noisy] = &tenants[..] else {
        bail!("two tenants asked, {} made", tenants.len())
    };
    println!(
        "quiet tenant at {QUIET_PER_SECOND}/s, noisy tenant offering {NOISY_PER_SECOND}/s, each limited to \
         {LIMIT}/s per gateway; {ROUNDS} rounds of {:?} each:",
        seconds()
    );
    let mut ratios = Vec::new();
    for r in 0..ROUNDS {
        let (alone, beside, noise) = round(quiet, noisy, r % 2 == 1).await?;
        ratios.push(report(&alone, &beside, &noise));
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "quiet tenant's p99 beside a noisy tenant at 10x its limit: median {:.2} of its p99 alone \
         (range {:.2}-{:.2}; goal <= 1.10)",
        ratios[ROUNDS / 2],
        ratios[0],
        ratios[ROUNDS - 1]
    );

    reqwest::Client::new()
        .patch(format!("{api}/queue-services/main"))
        .bearer_auth(&noisy.token)
        .json(&json!({"requestsPerSecond": 100_000}))
        .send()
        .await?
        .error_for_status()?;
    // The gateway takes the change with its next routing table.
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!("the same with the noisy tenant's own rate at 100,000/s (its whole offer reaches its engine):");
    let (alone, beside, noise) = round(quiet, noisy, false).await?;
    if noise.throttled > 0 {
        bail!(
            "the noisy tenant's own rate did not reach the gateway: {} throttled",
            noise.throttled
        );
    }
    let unlimited = report(&alone, &beside, &noise);
    println!(
        "quiet tenant's p99 beside the noisy tenant unlimited: {unlimited:.2} of its p99 alone, against {:.2} \
         limited",
        ratios[ROUNDS / 2]
    );
    drop(process);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
