//! [`ControlStore`] on Redis, shared by several controller replicas.
//!
//! Every key lives under the hash tag `{activity}`, so all of them sit in one
//! Redis Cluster slot and one Lua script may touch any of them. Each
//! check-and-write is one script (validate first, write last); times and TTLs
//! come from the Redis clock (`PEXPIRE`, `TIME`). Each call runs under our own
//! deadline, because a reconnecting client can otherwise wait for the whole
//! reconnect.

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, Script};

use super::{ControlStore, Result, StoreError};
use crate::model::{Acknowledgement, IssuedSnapshot, OutcomeBatch, OutcomeKind, RuntimeReport, Session};

const KINDS: [OutcomeKind; 4] = [
    OutcomeKind::Ok,
    OutcomeKind::ClientError,
    OutcomeKind::AuthFailed,
    OutcomeKind::BackendError,
];

struct Scripts {
    open_session: Script,
    record_issued: Script,
    acknowledge: Script,
    replace_runtime: Script,
    record_outcomes: Script,
}

pub struct RedisStore {
    conn: ConnectionManager,
    /// `{namespace}:{activity}:`
    prefix: String,
    deadline: Duration,
    scripts: Scripts,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

impl RedisStore {
    /// Connects lazily: a Redis that is down at start is retried on use.
    /// `namespace` separates deployments (and tests) sharing one Redis.
    pub fn new(url: &str, namespace: &str, deadline: Duration) -> Result<Self> {
        let client = redis::Client::open(url).map_err(unavailable)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(deadline))
            .set_response_timeout(Some(deadline))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client, config).map_err(unavailable)?;
        Ok(Self {
            conn,
            prefix: format!("{namespace}:{{activity}}:"),
            deadline,
            scripts: Scripts {
                open_session: Script::new(include_str!("lua/open_session.lua")),
                record_issued: Script::new(include_str!("lua/record_issued.lua")),
                acknowledge: Script::new(include_str!("lua/acknowledge.lua")),
                replace_runtime: Script::new(Self::REPLACE_RUNTIME_SCRIPT),
                record_outcomes: Script::new(include_str!("lua/record_outcomes.lua")),
            },
        })
    }

    fn key(&self, parts: &[&str]) -> String {
        format!("{}{}", self.prefix, parts.join(":"))
    }

    async fn bounded<T>(&self, call: impl std::future::Future<Output = redis::RedisResult<T>>) -> Result<T> {
        match tokio::time::timeout(self.deadline, call).await {
            Ok(result) => result.map_err(unavailable),
            Err(_) => Err(StoreError::Unavailable("redis call exceeded its deadline".into())),
        }
    }

    /// Runs a script and maps its `{code, value}` reply.
    async fn run(&self, invocation: &mut redis::ScriptInvocation<'_>) -> Result<i64> {
        let mut conn = self.conn.clone();
        let (code, value): (String, i64) = self.bounded(invocation.invoke_async(&mut conn)).await?;
        match code.as_str() {
            "OK" => Ok(value),
            "STALE_SESSION" => Err(StoreError::StaleSession),
            "STALE_EPOCH" => Err(StoreError::StaleEpoch),
            "ACK_MISMATCH" => Err(StoreError::AckMismatch),
            "NOT_ACKNOWLEDGED" => Err(StoreError::NotAcknowledged),
            "SNAPSHOT_MISMATCH" => Err(StoreError::SnapshotMismatch),
            "STALE_REPORT" => Err(StoreError::StaleReport),
            "CONFLICTING_REPORT" => Err(StoreError::ConflictingReport),
            // Only the outcome script says this; the caller maps it to `false`.
            "DUPLICATE" => Ok(0),
            other => Err(StoreError::Unavailable(format!("unexpected script reply {other}"))),
        }
    }

    fn epoch_key(&self) -> String {
        self.key(&["ownership_epoch"])
    }

    /// Source of the `ReplaceRuntime` script, for benchmarks that run it
    /// directly as a baseline.
    pub const REPLACE_RUNTIME_SCRIPT: &'static str = include_str!("lua/replace_runtime.lua");

    /// The keys and arguments of one `ReplaceRuntime` script call.
    pub fn replace_runtime_call(
        &self,
        report: &RuntimeReport,
        session_ttl: Duration,
        report_ttl: Duration,
    ) -> (Vec<String>, Vec<String>) {
        let w = report.worker_id.as_str();
        let keys = vec![self.key(&["session", w]), self.key(&["runtime", w]), self.epoch_key()];
        let args = vec![
            report.session_id.clone(),
            report.sequence.to_string(),
            report.snapshot_version.to_string(),
            report.ownership_epoch.to_string(),
            report.digest(),
            report.canonical_body(),
            ms(session_ttl).to_string(),
            ms(report_ttl).to_string(),
        ];
        (keys, args)
    }
}

fn positive(v: i64) -> u64 {
    u64::try_from(v).unwrap_or_default()
}

#[async_trait]
impl ControlStore for RedisStore {
    async fn current_ownership_epoch(&self) -> Result<u64> {
        let mut conn = self.conn.clone();
        let key = self.epoch_key();
        // SET NX then GET, atomically: initialises to 1 exactly once across replicas.
        let (epoch,): (u64,) = self
            .bounded(
                redis::pipe()
                    .atomic()
                    .cmd("SET")
                    .arg(&key)
                    .arg(1)
                    .arg("NX")
                    .ignore()
                    .get(&key)
                    .query_async(&mut conn),
            )
            .await?;
        Ok(epoch)
    }

    async fn claim_ownership(&self) -> Result<u64> {
        let mut conn = self.conn.clone();
        let key = self.epoch_key();
        self.bounded(conn.incr(&key, 1u64)).await
    }

    async fn next_snapshot_version(&self) -> Result<u64> {
        let mut conn = self.conn.clone();
        let key = self.key(&["snapshot_version"]);
        self.bounded(conn.incr(&key, 1u64)).await
    }

    async fn open_session(&self, session: &Session, ttl: Duration) -> Result<u64> {
        let labels = serde_json::to_string(&session.labels).map_err(unavailable)?;
        let w = session.worker_id.as_str();
        let epoch = self
            .run(
                self.scripts
                    .open_session
                    .key(self.key(&["session", w]))
                    .key(self.key(&["runtime", w]))
                    .key(self.key(&["issued", w]))
                    .key(self.epoch_key())
                    .arg(&session.session_id)
                    .arg(&session.instance_id)
                    .arg(&session.zone)
                    .arg(labels)
                    .arg(ms(ttl)),
            )
            .await?;
        Ok(positive(epoch))
    }

    async fn session(&self, worker_id: &str) -> Result<Option<Session>> {
        let mut conn = self.conn.clone();
        let key = self.key(&["session", worker_id]);
        let fields: Vec<Option<String>> = self
            .bounded(
                redis::cmd("HMGET")
                    .arg(&key)
                    .arg(&["sid", "instance", "zone", "labels", "acked_v", "acked_e", "nacked_v"])
                    .query_async(&mut conn),
            )
            .await?;
        let [sid, instance, zone, labels, acked_v, acked_e, nacked_v]: [Option<String>; 7] =
            fields.try_into().map_err(|_| unavailable("short HMGET reply"))?;
        let Some(session_id) = sid else {
            return Ok(None);
        };
        let num = |v: Option<String>| v.and_then(|v| v.parse().ok()).unwrap_or(0u64);
        Ok(Some(Session {
            worker_id: worker_id.to_owned(),
            session_id,
            instance_id: instance.unwrap_or_default(),
            zone: zone.unwrap_or_default(),
            labels: labels.and_then(|l| serde_json::from_str(&l).ok()).unwrap_or_default(),
            acked_version: num(acked_v),
            acked_epoch: num(acked_e),
            nacked_version: num(nacked_v),
        }))
    }

    async fn record_issued_snapshot(&self, issued: &IssuedSnapshot, ttl: Duration) -> Result<()> {
        let w = issued.worker_id.as_str();
        self.run(
            self.scripts
                .record_issued
                .key(self.key(&["issued", w]))
                .key(self.key(&["session", w]))
                .key(self.epoch_key())
                .arg(&issued.session_id)
                .arg(issued.snapshot.version)
                .arg(issued.snapshot.ownership_epoch)
                .arg(sless_runtime::hex::encode(&issued.snapshot.checksum))
                .arg(&issued.nonce)
                .arg(ms(ttl)),
        )
        .await
        .map(drop)
    }

    async fn acknowledge_snapshot(&self, ack: &Acknowledgement, session_ttl: Duration) -> Result<()> {
        let w = ack.worker_id.as_str();
        self.run(
            self.scripts
                .acknowledge
                .key(self.key(&["session", w]))
                .key(self.key(&["runtime", w]))
                .key(self.key(&["issued", w]))
                .arg(&ack.session_id)
                .arg(ack.snapshot.version)
                .arg(ack.snapshot.ownership_epoch)
                .arg(sless_runtime::hex::encode(&ack.snapshot.checksum))
                .arg(if ack.applied { "1" } else { "0" })
                .arg(&ack.nonce)
                .arg(ms(session_ttl)),
        )
        .await
        .map(drop)
    }

    async fn replace_runtime(
        &self,
        report: &RuntimeReport,
        session_ttl: Duration,
        report_ttl: Duration,
    ) -> Result<u64> {
        let (keys, args) = self.replace_runtime_call(report, session_ttl, report_ttl);
        let mut invocation = self.scripts.replace_runtime.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        for arg in args {
            invocation.arg(arg);
        }
        Ok(positive(self.run(&mut invocation).await?))
    }

    async fn record_outcomes(&self, batch: &OutcomeBatch, session_ttl: Duration, dedup_ttl: Duration) -> Result<bool> {
        let w = batch.worker_id.as_str();
        let mut invocation = self.scripts.record_outcomes.prepare_invoke();
        invocation
            .key(self.key(&["session", w]))
            .key(self.key(&["outcome_batch", w, &batch.session_id, &batch.batch_id]))
            .key(self.key(&["outcome_totals"]))
            .arg(&batch.session_id)
            .arg(ms(session_ttl))
            .arg(ms(dedup_ttl));
        for o in &batch.outcomes {
            invocation.arg(&o.proxy_id).arg(o.kind.as_str()).arg(o.count);
        }
        Ok(self.run(&mut invocation).await? == 1)
    }

    async fn outcome_totals(&self, proxy_id: &str) -> Result<Vec<(String, i64)>> {
        let mut conn = self.conn.clone();
        let fields: Vec<String> = KINDS.iter().map(|k| format!("{proxy_id}|{}", k.as_str())).collect();
        let values: Vec<Option<i64>> = self
            .bounded(
                redis::cmd("HMGET")
                    .arg(self.key(&["outcome_totals"]))
                    .arg(&fields)
                    .query_async(&mut conn),
            )
            .await?;
        let mut totals: Vec<(String, i64)> = KINDS
            .iter()
            .zip(values)
            .filter_map(|(k, v)| v.map(|v| (k.as_str().to_owned(), v)))
            .collect();
        totals.sort();
        Ok(totals)
    }

    async fn ping(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        self.bounded(redis::cmd("PING").query_async::<String>(&mut conn))
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// Real Redis: `SLESS_TEST_REDIS_URL`, default the local server.
    pub fn url() -> String {
        std::env::var("SLESS_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
    }

    #[tokio::test]
    async fn contract() {
        super::super::contract::run_all(|| async {
            let ns = format!("test-{}", sless_runtime::random::id());
            super::RedisStore::new(&url(), &ns, Duration::from_secs(2)).unwrap()
        })
        .await;
    }

    #[tokio::test]
    async fn every_key_carries_the_activity_hash_tag() {
        let ns = format!("test-{}", sless_runtime::random::id());
        let store = super::RedisStore::new(&url(), &ns, Duration::from_secs(2)).unwrap();
        super::super::contract::exercise_every_method(&store).await;
        let client = redis::Client::open(url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{ns}*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(keys.len() >= 5, "{keys:?}");
        for key in keys {
            assert!(key.starts_with(&format!("{ns}:{{activity}}:")), "{key}");
        }
    }
}
