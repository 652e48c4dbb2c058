//! A redis-server of one test, on its own port.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A private redis-server on its own port, killed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> Self {
        let mut server = Self {
            port: crate::free_port(),
            child: None,
        };
        server.restart();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts it (again) on its port, empty: it keeps nothing on disk.
    pub fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &self.port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/install-test-deps.sh)");
        self.child = Some(child);
        // Ready when it answers PING: it accepts connections before it
        // serves them, and a first call under a short deadline would fail.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.answers_ping() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn answers_ping(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
        let mut answer = [0u8; 7];
        conn.write_all(b"PING\r\n").is_ok() && conn.read_exact(&mut answer).is_ok() && &answer == b"+PONG\r\n"
    }

    /// kill -9: everything it held is lost.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
