//! sless queues against the brokers a cloud provider already runs:
//! RabbitMQ (quorum and classic durable queues, publisher confirms) and NATS
//! JetStream (file storage), the same work in the same run, each through
//! the Rust client made for it, at equal durability:
//!
//! - sless `disk` (fsync before the answer) against RabbitMQ's quorum and
//!   classic durable queues (persistent messages, confirms after the write
//!   to disk);
//! - sless `process` (written to the journal before the answer, synced
//!   within 100 ms) against JetStream 2.9 (acknowledged once written to its
//!   file, before any fsync).
//!
//! Scenarios, 200-byte messages:
//! (a) one message per request, each awaited, 1 and 32 producers;
//! (b) batches as each system's clients make them: SendMessageBatch of 10,
//!     10 confirms outstanding per RabbitMQ channel, 10 JetStream publishes
//!     in flight per producer; 1 and 32 producers;
//! (c) the full cycle: 32 producers and 32 consumers (send, receive,
//!     delete/ack), checking that every message arrived, counting repeats.
//!
//! Each line gives messages/s, the p50 and p99 of an acknowledgement (of a
//! batch in (b)), and the servers' CPU per message read from `/proc`; then
//! the ratios sless / peer (goal >= 1.0, p99 no worse).
//!
//! sless runs as in production: a `sless queue` engine process behind a
//! `sless gateway` process, SigV4-signed by the client. RabbitMQ must be on
//! 127.0.0.1:5672 (guest/guest) and NATS with JetStream on 127.0.0.1:4222
//! (`scripts/install-test-deps.sh` starts both); the bench starts neither
//! and uses queues and streams of its own, deleted afterwards.
//!
//! Replicated, at equal replication: `sless disk x3` is three `sless queue`
//! replicas of one queue service (disk) behind one gateway, which asks
//! replica 1 (the leader: it started the service) first; `RabbitMQ quorum
//! x3` a quorum queue of three members on a cluster of three nodes
//! (b1..b3@localhost) that the bench starts from `/usr/lib/rabbitmq/bin` on
//! loopback ports and files of its own, apart from the broker on 5672, and
//! stops afterwards, with its producers and consumers spread over the three
//! nodes. Both answer once a majority synced the message.
//!
//! Run: `cargo bench -p sless --bench brokers`. `SLESS_BENCH_SECONDS` sets
//! each run's length (5); `SLESS_BENCH_ONLY=(c)` runs only the scenarios
//! whose title contains it, `SLESS_BENCH_SYSTEMS=sless` only the systems
//! whose label does (`x3` the replicated pair; with one system, no
//! ratios). Only the servers of the systems chosen must be up.

// A benchmark's output is its figures, on stdout.
#![allow(clippy::print_stdout)]

#[path = "support.rs"]
mod support;

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde_json::{Value, json};
use sless_sqs::client::{Client, MAX_ANSWER_BYTES};
use support::{ACCESS, Process, REGION, SECRET};

const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const NATS: &str = "127.0.0.1:4222";
const BODY_BYTES: usize = 200;
const MANY: usize = 32;
const BATCH: usize = 10;

fn seconds() -> Duration {
    Duration::from_secs(
        std::env::var("SLESS_BENCH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(5),
    )
}

/// A message body of [`BODY_BYTES`] that starts with its unique id.
fn body(id: &str) -> String {
    format!("{id:.<BODY_BYTES$}")
}

fn id_of(body: &[u8]) -> String {
    String::from_utf8_lossy(body).trim_end_matches('.').to_owned()
}

/// The systems compared, each with the processes whose CPU it is charged.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    SlessDisk,
    SlessProcess,
    RabbitQuorum,
    RabbitClassic,
    JetStream,
    SlessDiskX3,
    RabbitQuorumX3,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::SlessDisk,
        Kind::RabbitQuorum,
        Kind::RabbitClassic,
        Kind::SlessProcess,
        Kind::JetStream,
        Kind::SlessDiskX3,
        Kind::RabbitQuorumX3,
    ];

    fn label(self) -> &'static str {
        match self {
            Kind::SlessDisk => "sless disk",
            Kind::SlessProcess => "sless process",
            Kind::RabbitQuorum => "RabbitMQ quorum",
            Kind::RabbitClassic => "RabbitMQ classic",
            Kind::JetStream => "JetStream file",
            Kind::SlessDiskX3 => "sless disk x3",
            Kind::RabbitQuorumX3 => "RabbitMQ quorum x3",
        }
    }
}

/// The servers the bench started for the systems chosen.
struct Systems {
    sless: HashMap<Kind, Arc<Sless>>,
    cluster: Option<RabbitCluster>,
}

/// A sless engine process, or three replicas of one queue service, with
/// their gateway.
struct Sless {
    _engines: Vec<Process>,
    _gateway: Process,
    /// Where queues are made: the engine, or replica 1.
    engine: std::net::SocketAddr,
    gateway_url: String,
    pids: Vec<u32>,
    http: reqwest::Client,
    _dir: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Sless {
    async fn start(durability: &str, replicas: bool) -> anyhow::Result<Self> {
        let name = if replicas {
            format!("{durability}-x3")
        } else {
            durability.to_owned()
        };
        let dir = TempDir(std::env::temp_dir().join(format!("sless-bench-brokers-{name}-{}", std::process::id())));
        let engines = if replicas {
            support::engine_replicas(&dir.0, durability).await?
        } else {
            vec![support::engine(Some((&dir.0, durability))).await?]
        };
        let engine = engines.first().context("no engine")?.1;
        // The route names every replica; the gateway asks them in turn.
        let backend = engines
            .iter()
            .map(|(_, addr)| addr.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let (gateway_process, gateway_url) = support::gateway_to(&backend).await?;
        let mut pids: Vec<u32> = engines.iter().map(|(process, _)| process.id()).collect();
        pids.push(gateway_process.id());
        Ok(Self {
            _engines: engines.into_iter().map(|(process, _)| process).collect(),
            _gateway: gateway_process,
            engine,
            gateway_url,
            pids,
            http: reqwest::Client::builder().pool_max_idle_per_host(2 * MANY).build()?,
            _dir: dir,
        })
    }

    fn client(&self) -> Client {
        Client::new(self.http.clone(), ACCESS, SECRET, REGION)
    }
}

/// Where one run's messages go: a queue or stream of its own.
#[derive(Clone)]
enum Target {
    Sless {
        sless: Arc<Sless>,
        queue: String,
    },
    /// `urls`: the broker, or each node of the cluster; client `n` takes
    /// the `n`th, round.
    Rabbit {
        queue: String,
        urls: Arc<[String]>,
    },
    Jet {
        stream: String,
        subject: String,
    },
}

impl Target {
    async fn create(kind: Kind, systems: &Systems, name: &str) -> anyhow::Result<Self> {
        Ok(match kind {
            Kind::SlessDisk | Kind::SlessProcess | Kind::SlessDiskX3 => {
                let sless = systems.sless.get(&kind).context("sless was not started")?.clone();
                let queue = support::create_queue(sless.engine, name).await?;
                Target::Sless { sless, queue }
            }
            Kind::RabbitQuorum | Kind::RabbitClassic | Kind::RabbitQuorumX3 => {
                let urls = if kind == Kind::RabbitQuorumX3 {
                    let cluster = systems
                        .cluster
                        .as_ref()
                        .context("the RabbitMQ cluster was not started")?;
                    cluster.urls.clone()
                } else {
                    Arc::from([AMQP.to_owned()])
                };
                let (connection, channel) = rabbit(&urls[0]).await?;
                let mut arguments = FieldTable::default();
                let queue_type = if kind == Kind::RabbitClassic {
                    "classic"
                } else {
                    "quorum"
                };
                arguments.insert("x-queue-type".into(), AMQPValue::LongString(queue_type.into()));
                if kind == Kind::RabbitQuorumX3 {
                    // One member on each node, said rather than left to the default.
                    arguments.insert("x-quorum-initial-group-size".into(), AMQPValue::LongInt(3));
                }
                let queue = format!("sless-bench-{name}");
                channel
                    .queue_declare(
                        queue.as_str().into(),
                        QueueDeclareOptions {
                            durable: true,
                            ..Default::default()
                        },
                        arguments,
                    )
                    .await?;
                connection.close(200, "declared".into()).await?;
                Target::Rabbit { queue, urls }
            }
            Kind::JetStream => {
                let js = jetstream::new(async_nats::connect(NATS).await?);
                let stream = format!("SLESSBENCH_{}", name.replace('-', "_"));
                let subject = format!("slessbench.{name}");
                js.create_stream(jetstream::stream::Config {
                    name: stream.clone(),
                    subjects: vec![subject.clone()],
                    storage: jetstream::stream::StorageType::File,
                    ..Default::default()
                })
                .await?;
                Target::Jet { stream, subject }
            }
        })
    }

    async fn delete(&self) -> anyhow::Result<()> {
        match self {
            Target::Sless { sless, queue } => {
                let queue = SlessQueue::new(sless, queue);
                queue.call("DeleteQueue", json!({"QueueUrl": queue.queue})).await?;
            }
            Target::Rabbit { queue, urls } => {
                let (connection, channel) = rabbit(&urls[0]).await?;
                channel
                    .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                    .await?;
                connection.close(200, "deleted".into()).await?;
            }
            Target::Jet { stream, .. } => {
                let js = jetstream::new(async_nats::connect(NATS).await?);
                js.delete_stream(stream).await?;
            }
        }
        Ok(())
    }

    async fn producer(&self, n: usize) -> anyhow::Result<Producer> {
        Ok(match self {
            Target::Sless { sless, queue } => Producer::Sless(SlessQueue::new(sless, queue)),
            Target::Rabbit { queue, urls } => {
                let (connection, channel) = rabbit(&urls[n % urls.len()]).await?;
                channel.confirm_select(ConfirmSelectOptions::default()).await?;
                Producer::Rabbit {
                    _connection: connection,
                    channel,
                    queue: queue.clone(),
                }
            }
            Target::Jet { subject, .. } => Producer::Jet {
                js: jetstream::new(async_nats::connect(NATS).await?),
                subject: subject.clone(),
            },
        })
    }

    async fn consumer(&self, n: usize) -> anyhow::Result<Consumer> {
        Ok(match self {
            Target::Sless { sless, queue } => Consumer::Sless(SlessQueue::new(sless, queue)),
            Target::Rabbit { queue, urls } => {
                let (connection, channel) = rabbit(&urls[n % urls.len()]).await?;
                channel.basic_qos(BATCH as u16 * 10, BasicQosOptions::default()).await?;
                let consumer = channel
                    .basic_consume(
                        queue.as_str().into(),
                        format!("bench-{n}").as_str().into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await?;
                Consumer::Rabbit {
                    _connection: connection,
                    consumer,
                }
            }
            Target::Jet { stream, .. } => {
                let js = jetstream::new(async_nats::connect(NATS).await?);
                let consumer = js
                    .get_stream(stream)
                    .await?
                    .get_or_create_consumer(
                        "bench",
                        jetstream::consumer::pull::Config {
                            durable_name: Some("bench".into()),
                            ack_policy: jetstream::consumer::AckPolicy::Explicit,
                            ..Default::default()
                        },
                    )
                    .await?;
                Consumer::Jet {
                    messages: consumer.messages().await?,
                }
            }
        })
    }
}

/// A sless queue as a client reaches it: through the gateway.
struct SlessQueue {
    client: Client,
    url: String,
    queue: String,
}

impl SlessQueue {
    fn new(sless: &Sless, queue: &str) -> Self {
        Self {
            client: sless.client(),
            url: sless.gateway_url.clone(),
            queue: queue.to_owned(),
        }
    }

    async fn call(&self, action: &str, input: Value) -> anyhow::Result<Value> {
        self.client
            .call(&self.url, action, &input, MAX_ANSWER_BYTES)
            .await
            .map_err(|e| anyhow::anyhow!("{action}: {e}"))
    }
}

/// A connection to RabbitMQ at `url` and a channel on it.
async fn rabbit(url: &str) -> anyhow::Result<(Connection, lapin::Channel)> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    Ok((connection, channel))
}

/// RabbitMQ's own scripts: those in `/usr/sbin` run them as the rabbitmq
/// user, with the cookie and files of the broker on 5672.
const RABBIT_BIN: &str = "/usr/lib/rabbitmq/bin";
/// How long a node may take to boot; three boot at once on 2 cores.
const RABBIT_BOOT: Duration = Duration::from_secs(120);

/// A RabbitMQ cluster of three nodes, b1..b3@localhost, on loopback ports
/// and in a temporary directory of its own, apart from the broker on 5672:
/// stopped, killed if need be, and removed when dropped.
struct RabbitCluster {
    names: Vec<String>,
    /// Each node's AMQP URL.
    urls: Arc<[String]>,
    pids: Vec<u32>,
    /// Dropped after `drop` stopped the nodes: kills what is left.
    nodes: Vec<Process>,
    /// Dropped last: the nodes' files, the cookie.
    dir: TempDir,
}

impl RabbitCluster {
    fn start() -> anyhow::Result<Self> {
        let dir = TempDir(std::env::temp_dir().join(format!("sless-bench-rabbit-{}", std::process::id())));
        std::fs::create_dir_all(&dir.0).with_context(|| format!("cannot make {}", dir.0.display()))?;
        // The nodes and rabbitmqctl read it from $HOME, this directory;
        // Erlang refuses a cookie others may read.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .open(dir.0.join(".erlang.cookie"))?
            .write_all(b"SLESSBENCHRABBITCOOKIE")?;
        // Empty: no plugins (no management listener), nothing from /etc/rabbitmq.
        for empty in ["enabled_plugins", "rabbitmq-env.conf", "rabbitmq.conf"] {
            std::fs::write(dir.0.join(empty), "")?;
        }
        let mut cluster = Self {
            names: Vec::new(),
            urls: Arc::from([]),
            pids: Vec::new(),
            nodes: Vec::new(),
            dir,
        };
        let mut urls = Vec::new();
        let mut ports = Vec::new();
        for i in 1..=3 {
            let name = format!("b{i}@localhost");
            let port = support::free_port()?;
            let node_dir = cluster.dir.0.join(format!("b{i}"));
            std::fs::create_dir_all(&node_dir)?;
            let out = std::fs::File::create(node_dir.join("out"))?;
            let mut command = Command::new(Path::new(RABBIT_BIN).join("rabbitmq-server"));
            cluster.env(&mut command);
            command
                .env("RABBITMQ_NODENAME", &name)
                .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
                .env("RABBITMQ_NODE_PORT", port.to_string())
                .env("RABBITMQ_DIST_PORT", support::free_port()?.to_string())
                .env("RABBITMQ_MNESIA_BASE", node_dir.join("mnesia"))
                .env("RABBITMQ_LOG_BASE", node_dir.join("log"))
                // The nodes speak to each other on loopback only.
                .env(
                    "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                    "-kernel inet_dist_use_interface {127,0,0,1}",
                )
                // Its banner and boot log are not the bench's output.
                .stdin(Stdio::null())
                .stdout(out.try_clone()?)
                .stderr(out);
            let node = Process::spawn(&mut command)
                .with_context(|| format!("cannot start {RABBIT_BIN}/rabbitmq-server (is RabbitMQ installed?)"))?;
            cluster.pids.push(node.id());
            cluster.nodes.push(node);
            cluster.names.push(name);
            urls.push(format!("amqp://guest:guest@127.0.0.1:{port}/%2f"));
            ports.push(port);
        }
        cluster.urls = urls.into();
        for (i, port) in ports.into_iter().enumerate() {
            cluster.wait_listening(i, port)?;
            cluster.ctl(i, &["await_startup"])?;
        }
        let first = cluster.names[0].clone();
        for i in 1..cluster.names.len() {
            cluster.ctl(i, &["stop_app"])?;
            cluster.ctl(i, &["join_cluster", &first])?;
            cluster.ctl(i, &["start_app"])?;
        }
        let status: Value = serde_json::from_str(&cluster.ctl(0, &["cluster_status", "--formatter", "json"])?)
            .context("rabbitmqctl cluster_status is not JSON")?;
        let running = status["running_nodes"].as_array().map_or(0, Vec::len);
        if running != cluster.names.len() {
            bail!("the RabbitMQ cluster runs {running} nodes, not 3: {status}");
        }
        Ok(cluster)
    }

    /// What every RabbitMQ command of this cluster is started with.
    fn env(&self, command: &mut Command) {
        let dir = &self.dir.0;
        command
            .env("HOME", dir)
            .env("RABBITMQ_CONF_ENV_FILE", dir.join("rabbitmq-env.conf"))
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
            .env("RABBITMQ_ADVANCED_CONFIG_FILE", dir.join("advanced.config"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"));
    }

    /// Waits until node `i` takes AMQP connections on `port`.
    fn wait_listening(&mut self, i: usize, port: u16) -> anyhow::Result<()> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + RABBIT_BOOT;
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
            if let Some(status) = self.nodes[i].child().try_wait()? {
                let out = std::fs::read_to_string(self.dir.0.join(format!("b{}/out", i + 1))).unwrap_or_default();
                bail!("RabbitMQ node {} ended ({status}): {out}", self.names[i]);
            }
            if Instant::now() > deadline {
                bail!(
                    "RabbitMQ node {} is not listening on {addr} after {RABBIT_BOOT:?}",
                    self.names[i]
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// `rabbitmqctl -n NODE args` for node `i`; its output.
    fn ctl(&self, i: usize, args: &[&str]) -> anyhow::Result<String> {
        let mut command = Command::new(Path::new(RABBIT_BIN).join("rabbitmqctl"));
        self.env(&mut command);
        let output = command
            .args(["-n", &self.names[i]])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {RABBIT_BIN}/rabbitmqctl"))?;
        if !output.status.success() {
            bail!(
                "rabbitmqctl -n {} {}: {}: {}{}",
                self.names[i],
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl Drop for RabbitCluster {
    fn drop(&mut self) {
        // The nodes started last first; a node that is down answers at once.
        for i in (0..self.names.len()).rev() {
            let _ = self.ctl(i, &["stop"]);
        }
    }
}

enum Producer {
    Sless(SlessQueue),
    Rabbit {
        _connection: Connection,
        channel: lapin::Channel,
        queue: String,
    },
    Jet {
        js: jetstream::Context,
        subject: String,
    },
}

impl Producer {
    /// Sends `bodies` (1, or a batch) and returns once every one is
    /// acknowledged.
    async fn send(&self, bodies: &[String]) -> anyhow::Result<()> {
        match self {
            Producer::Sless(sless) => {
                let answer = if let [one] = bodies {
                    sless
                        .call("SendMessage", json!({"QueueUrl": sless.queue, "MessageBody": one}))
                        .await?
                } else {
                    let entries: Vec<Value> = bodies
                        .iter()
                        .enumerate()
                        .map(|(i, b)| json!({"Id": i.to_string(), "MessageBody": b}))
                        .collect();
                    sless
                        .call("SendMessageBatch", json!({"QueueUrl": sless.queue, "Entries": entries}))
                        .await?
                };
                let failed = answer["Failed"].as_array().map_or(0, Vec::len);
                if failed > 0 {
                    bail!("{failed} entries of a batch failed: {answer}");
                }
            }
            Producer::Rabbit { channel, queue, .. } => {
                let mut confirms = Vec::with_capacity(bodies.len());
                for b in bodies {
                    confirms.push(
                        channel
                            .basic_publish(
                                "".into(),
                                queue.as_str().into(),
                                BasicPublishOptions::default(),
                                b.as_bytes(),
                                BasicProperties::default().with_delivery_mode(2),
                            )
                            .await?,
                    );
                }
                for confirm in confirms {
                    if !confirm.await?.is_ack() {
                        bail!("RabbitMQ refused a publish (nack)");
                    }
                }
            }
            Producer::Jet { js, subject } => {
                let mut acks = Vec::with_capacity(bodies.len());
                for b in bodies {
                    acks.push(js.publish(subject.clone(), b.clone().into_bytes().into()).await?);
                }
                for ack in acks {
                    ack.await?;
                }
            }
        }
        Ok(())
    }
}

enum Consumer {
    Sless(SlessQueue),
    Rabbit {
        _connection: Connection,
        consumer: lapin::Consumer,
    },
    Jet {
        messages: jetstream::consumer::pull::Stream,
    },
}

impl Consumer {
    /// The ids of the next messages, each deleted or acknowledged; none
    /// after about a second without any.
    async fn next(&mut self) -> anyhow::Result<Vec<String>> {
        const WAIT: Duration = Duration::from_secs(1);
        match self {
            Consumer::Sless(sless) => {
                let got = sless
                    .call(
                        "ReceiveMessage",
                        json!({"QueueUrl": sless.queue, "MaxNumberOfMessages": BATCH, "WaitTimeSeconds": 1}),
                    )
                    .await?;
                let messages = got["Messages"].as_array().cloned().unwrap_or_default();
                if messages.is_empty() {
                    return Ok(Vec::new());
                }
                let entries: Vec<Value> = messages
                    .iter()
                    .enumerate()
                    .map(|(i, m)| json!({"Id": i.to_string(), "ReceiptHandle": m["ReceiptHandle"]}))
                    .collect();
                sless
                    .call(
                        "DeleteMessageBatch",
                        json!({"QueueUrl": sless.queue, "Entries": entries}),
                    )
                    .await?;
                Ok(messages
                    .iter()
                    .map(|m| id_of(m["Body"].as_str().unwrap_or_default().as_bytes()))
                    .collect())
            }
            Consumer::Rabbit { consumer, .. } => match tokio::time::timeout(WAIT, consumer.next()).await {
                Ok(Some(delivery)) => {
                    let delivery = delivery?;
                    delivery.acker.ack(BasicAckOptions::default()).await?;
                    Ok(vec![id_of(&delivery.data)])
                }
                Ok(None) => bail!("the RabbitMQ consumer was cancelled"),
                Err(_) => Ok(Vec::new()),
            },
            Consumer::Jet { messages } => match tokio::time::timeout(WAIT, messages.next()).await {
                Ok(Some(message)) => {
                    let message = message.map_err(|e| anyhow::anyhow!("JetStream: {e}"))?;
                    message.ack().await.map_err(|e| anyhow::anyhow!("JetStream ack: {e}"))?;
                    Ok(vec![id_of(&message.payload)])
                }
                Ok(None) => bail!("the JetStream consumer ended"),
                Err(_) => Ok(Vec::new()),
            },
        }
    }
}

/// What one run measured.
struct Run {
    messages: u64,
    elapsed: Duration,
    latencies: Vec<Duration>,
    cpu: Duration,
    /// This process's CPU: the clients'.
    client_cpu: Duration,
    /// The full cycle only: messages never received, and receipts beyond
    /// the first of one message.
    lost: u64,
    repeated: u64,
}

impl Run {
    fn rate(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64()
    }

    fn quantile(&self, q: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        self.latencies[((self.latencies.len() - 1) as f64 * q) as usize]
    }

    fn line(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut line = format!(
            "{:>9.0} msg/s  p50 {:>6.2} ms  p99 {:>6.2} ms  CPU µs/msg: server {:>5.1}, client {:>5.1}",
            self.rate(),
            ms(self.quantile(0.5)),
            ms(self.quantile(0.99)),
            self.cpu.as_secs_f64() * 1e6 / self.messages.max(1) as f64,
            self.client_cpu.as_secs_f64() * 1e6 / self.messages.max(1) as f64
        );
        if self.lost > 0 || self.repeated > 0 {
            line.push_str(&format!("  LOST {} repeated {}", self.lost, self.repeated));
        }
        line
    }
}

/// The pids of the processes named `comm` (a server this bench does not own).
fn pids_named(comm: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm))
        .collect()
}

fn cpu_of(pids: &[u32]) -> Duration {
    pids.iter().map(|pid| support::cpu_time(*pid)).sum()
}

/// `producers` senders of `batch` messages per request for the run's
/// length; with `consumers`, as many receivers draining the same target
/// until every sent message is back (or 30 s pass without progress).
async fn run(target: &Target, pids: &[u32], producers: usize, batch: usize, consumers: usize) -> anyhow::Result<Run> {
    let mut senders = Vec::new();
    for n in 0..producers {
        senders.push(target.producer(n).await?);
    }
    let mut receivers = Vec::new();
    for n in 0..consumers {
        receivers.push(target.consumer(n).await?);
    }
    let sent = Arc::new(AtomicU64::new(0));
    let done_sending = Arc::new(AtomicBool::new(false));
    let cpu_before = cpu_of(pids);
    let client_before = support::own_cpu_time(std::process::id());
    let started = Instant::now();
    let deadline = started + seconds();
    let mut sending = Vec::new();
    for (p, sender) in senders.into_iter().enumerate() {
        let sent = sent.clone();
        sending.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut seq = 0u64;
            while Instant::now() < deadline {
                let bodies: Vec<String> = (0..batch)
                    .map(|_| {
                        seq += 1;
                        body(&format!("{p}-{seq}"))
                    })
                    .collect();
                let at = Instant::now();
                sender.send(&bodies).await?;
                latencies.push(at.elapsed());
                sent.fetch_add(batch as u64, Ordering::Relaxed);
            }
            anyhow::Ok(latencies)
        }));
    }
    let received: Arc<std::sync::Mutex<HashMap<String, u32>>> = Arc::default();
    let mut receiving = Vec::new();
    for mut receiver in receivers {
        let (received, sent, done_sending) = (received.clone(), sent.clone(), done_sending.clone());
        receiving.push(tokio::spawn(async move {
            let mut idle_since = Instant::now();
            loop {
                let ids = receiver.next().await?;
                let total = {
                    let mut seen = received.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                    for id in ids.iter() {
                        *seen.entry(id.clone()).or_default() += 1;
                    }
                    seen.len() as u64
                };
                if !ids.is_empty() {
                    idle_since = Instant::now();
                }
                let finished = done_sending.load(Ordering::SeqCst);
                if finished && total >= sent.load(Ordering::SeqCst) {
                    return anyhow::Ok(());
                }
                if finished && idle_since.elapsed() > Duration::from_secs(30) {
                    return anyhow::Ok(());
                }
            }
        }));
    }
    let mut latencies = Vec::new();
    for task in sending {
        latencies.extend(task.await??);
    }
    done_sending.store(true, Ordering::SeqCst);
    for task in receiving {
        task.await??;
    }
    let elapsed = started.elapsed();
    let cpu = cpu_of(pids) - cpu_before;
    let client_cpu = support::own_cpu_time(std::process::id()) - client_before;
    latencies.sort();
    let messages = sent.load(Ordering::SeqCst);
    let (lost, repeated) = if consumers == 0 {
        (0, 0)
    } else {
        let seen = received.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        let repeated = seen.values().map(|n| u64::from(n - 1)).sum();
        (messages.saturating_sub(seen.len() as u64), repeated)
    };
    Ok(Run {
        messages,
        elapsed,
        latencies,
        cpu,
        client_cpu,
        lost,
        repeated,
    })
}

fn reachable(addr: &str, what: &str) -> anyhow::Result<()> {
    std::net::TcpStream::connect_timeout(&addr.parse()?, Duration::from_secs(2))
        .map(drop)
        .with_context(|| format!("{what} is not reachable at {addr} (scripts/install-test-deps.sh starts it)"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let chosen = std::env::var("SLESS_BENCH_SYSTEMS").unwrap_or_default();
    let kinds: Vec<Kind> = Kind::ALL.into_iter().filter(|k| k.label().contains(&chosen)).collect();
    let wants = |any: &[Kind]| kinds.iter().any(|k| any.contains(k));
    let mut rabbit_pids = Vec::new();
    if wants(&[Kind::RabbitQuorum, Kind::RabbitClassic]) {
        reachable("127.0.0.1:5672", "RabbitMQ")?;
        // Read before the cluster starts: its nodes are beam.smp too.
        rabbit_pids = pids_named("beam.smp");
        if rabbit_pids.is_empty() {
            bail!("cannot find the beam.smp processes to read their CPU");
        }
    }
    let mut nats_pids = Vec::new();
    if wants(&[Kind::JetStream]) {
        reachable(NATS, "NATS")?;
        nats_pids = pids_named("nats-server");
        if nats_pids.is_empty() {
            bail!("cannot find the nats-server process to read its CPU");
        }
    }
    let mut systems = Systems {
        sless: HashMap::new(),
        cluster: None,
    };
    for (kind, durability, replicas) in [
        (Kind::SlessDisk, "disk", false),
        (Kind::SlessProcess, "process", false),
        (Kind::SlessDiskX3, "disk", true),
    ] {
        if wants(&[kind]) {
            let sless = Sless::start(durability, replicas).await.with_context(|| kind.label())?;
            systems.sless.insert(kind, Arc::new(sless));
        }
    }
    if wants(&[Kind::RabbitQuorumX3]) {
        systems.cluster = Some(RabbitCluster::start().context("starting a RabbitMQ cluster of three nodes")?);
    }
    let pids = |kind: Kind| -> Vec<u32> {
        match kind {
            Kind::SlessDisk | Kind::SlessProcess | Kind::SlessDiskX3 => {
                systems.sless.get(&kind).map(|s| s.pids.clone()).unwrap_or_default()
            }
            Kind::RabbitQuorum | Kind::RabbitClassic => rabbit_pids.clone(),
            Kind::RabbitQuorumX3 => systems.cluster.as_ref().map(|c| c.pids.clone()).unwrap_or_default(),
            Kind::JetStream => nats_pids.clone(),
        }
    };
    println!(
        "{BODY_BYTES}-byte messages, {} s a run; sless disk vs RabbitMQ (fsync before the answer), \
         sless process vs JetStream (written, not synced, before the answer)",
        seconds().as_secs()
    );
    if wants(&[Kind::SlessDiskX3, Kind::RabbitQuorumX3]) {
        println!(
            "x3: three replicas each on this machine, the answer once a majority synced the message; \
             CPU of all three and the gateway"
        );
    }
    // Wide enough for the longest label chosen, as before for the others.
    let width = kinds.iter().map(|k| k.label().len()).fold(17, usize::max);
    let scenarios: [(&str, usize, usize, usize); 5] = [
        ("(a) 1 producer, one message a request", 1, 1, 0),
        ("(a) 32 producers, one message a request", MANY, 1, 0),
        ("(b) 1 producer, batches of 10", 1, BATCH, 0),
        ("(b) 32 producers, batches of 10", MANY, BATCH, 0),
        ("(c) 32 producers + 32 consumers, full cycle", MANY, 1, MANY),
    ];
    let only = std::env::var("SLESS_BENCH_ONLY").unwrap_or_default();
    for (n, (title, producers, batch, consumers)) in scenarios.into_iter().enumerate() {
        if !title.contains(&only) {
            continue;
        }
        println!("{title}");
        let mut runs = HashMap::new();
        for &kind in &kinds {
            let target = Target::create(kind, &systems, &format!("run-{n}-{}", kind as u8)).await?;
            let result = run(&target, &pids(kind), producers, batch, consumers).await;
            target.delete().await?;
            let result = result.with_context(|| kind.label())?;
            println!("  {:<width$} {}", kind.label(), result.line());
            if result.lost > 0 {
                bail!("{} lost {} messages", kind.label(), result.lost);
            }
            runs.insert(kind as u8, result);
        }
        for (ours, peer) in [
            (Kind::SlessDisk, Kind::RabbitQuorum),
            (Kind::SlessDisk, Kind::RabbitClassic),
            (Kind::SlessProcess, Kind::JetStream),
            (Kind::SlessDiskX3, Kind::RabbitQuorumX3),
        ] {
            let (Some(a), Some(b)) = (runs.get(&(ours as u8)), runs.get(&(peer as u8))) else {
                continue;
            };
            println!(
                "  {} / {}: throughput {:.2}x (goal >= 1.0), p99 {:.2}x (goal <= 1.0)",
                ours.label(),
                peer.label(),
                a.rate() / b.rate(),
                a.quantile(0.99).as_secs_f64() / b.quantile(0.99).as_secs_f64().max(1e-9)
            );
        }
    }
    Ok(())
}
