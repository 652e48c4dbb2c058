//! Servers the tests start as processes of their own (Trino, Nessie, an S3
//! store): each the child of a shell that kills it, and removes its
//! directory, once the test process is gone, so a server shared by a test
//! binary never outlives its tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::TempDir;

/// A server process and its directory (its files, and `server.log`).
pub struct Watched {
    _child: Child,
    dir: TempDir,
    name: &'static str,
}

impl Watched {
    /// Starts `program` with `args` in a new directory (its working
    /// directory, filled by `prepare` first) with `env` set.
    pub fn start(
        name: &'static str,
        program: &Path,
        args: &[&str],
        env: &[(&str, &Path)],
        prepare: impl FnOnce(&Path),
    ) -> Self {
        let dir = TempDir::new(name);
        prepare(&dir.0);
        // A server that exits leaves a mark (its log stays for the error).
        // Paths are the shell's arguments, never parts of its text.
        let script = "dir=$1; parent=$2; shift 2; \
             \"$@\" >\"$dir/server.log\" 2>&1 & child=$!; \
             while kill -0 \"$parent\" 2>/dev/null; do \
               kill -0 $child 2>/dev/null || touch \"$dir/exited\"; sleep 1; \
             done; \
             kill -9 $child 2>/dev/null; wait $child; rm -rf \"$dir\"";
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(script)
            .arg(format!("{name}-watchdog"))
            .arg(&dir.0)
            .arg(std::process::id().to_string())
            .arg(program)
            .args(args)
            .current_dir(&dir.0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command.spawn().unwrap();
        Self {
            _child: child,
            dir,
            name,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir.0
    }

    /// Until `ready` holds, for `within`; panics with the log's end if the
    /// server exits or the time runs out.
    pub fn wait_until(&self, within: Duration, ready: impl Fn() -> bool) {
        let deadline = Instant::now() + within;
        while !ready() {
            assert!(
                !self.dir.0.join("exited").exists(),
                "{} exited at its start; its log ends:\n{}",
                self.name,
                self.log_tail()
            );
            assert!(
                Instant::now() < deadline,
                "{} did not start within {within:?}; its log ends:\n{}",
                self.name,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The last 4,000 characters of its log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.0.join("server.log")).unwrap_or_default();
        let skip = log.chars().count().saturating_sub(4000);
        log.chars().skip(skip).collect()
    }
}

/// A test binary's one server of a kind, started on first use: a start that
/// failed fails every later test at once with its reason, instead of
/// starting another server each time.
pub fn shared<T>(cell: &'static std::sync::OnceLock<Result<T, String>>, what: &str, start: fn() -> T) -> &'static T
where
    T: Sync + Send,
{
    let started = cell.get_or_init(|| {
        std::panic::catch_unwind(start).map_err(|e| {
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        })
    });
    match started {
        Ok(server) => server,
        Err(reason) => panic!("the test binary's {what} did not start: {reason}"),
    }
}

/// The answer to a plain HTTP/1.1 `request` (method and path, then any
/// headers) to loopback `port`, asked over a plain socket: the caller may
/// be inside a test's runtime, which cannot block on one.
pub fn ask(port: u16, request: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let whole = format!("{request}\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(whole.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

/// The directory of the tests' cached downloads (`SLESS_CACHE`, by default
/// `~/.cache/sless`), filled by scripts/install-test-deps.sh.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("SLESS_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/sless"))
}

/// The Temurin 25 JDK the Java servers run on (`SLESS_TRINO_JAVA_HOME`, named
/// for the first of them, overrides;
/// the machine's default Java, 17, is too old for them).
pub fn java_home() -> PathBuf {
    std::env::var_os("SLESS_TRINO_JAVA_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/jvm/temurin-25-jdk-amd64"))
}
