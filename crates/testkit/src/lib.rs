//! Helpers shared by the integration tests of several sless crates. A
//! dev-dependency only; it depends on `sless-controlplane` and `sless-sqs`
//! (whose own tests use it too, as tokio's use tokio-test).

pub mod clickhouse;
pub mod cp;
pub mod history;
pub mod kube_api;
pub mod nessie;
pub mod netns;
pub mod redis;
pub mod server;
pub mod sqs;
pub mod tls;
pub mod trino;

use std::path::PathBuf;

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sless-{tag}-{}-{}", std::process::id(), rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loopback port free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// POSTs `body` with `headers`: (status, body text).
pub async fn post(url: &str, headers: reqwest::header::HeaderMap, body: String) -> (u16, String) {
    let response = reqwest::Client::new()
        .post(url)
        .headers(headers)
        .body(body)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}
