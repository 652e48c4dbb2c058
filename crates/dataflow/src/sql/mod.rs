//! PostgreSQL plumbing shared by the source and the sink: connecting (TLS
//! by `sslmode`, only to addresses the egress policy permits), quoting
//! identifiers that come from a spec, and the tables exactly-once sinks
//! keep positions in, which no spec may name.

pub(crate) mod changes;
pub mod positions;
pub mod replication;
mod tls;

use std::sync::LazyLock;
use std::time::Duration;

use tokio_postgres::NoTls;
use tokio_postgres::config::{Host, SslMode};

use super::ConnectorError;
use super::egress::EgressPolicy;
use tls::{MakeRustls, Verify};

/// The system's CA bundle, trusted by `verify-ca`/`verify-full` without `sslrootcert`.
const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";
const CONNECT_TIMEOUT: Duration = crate::egress::CONNECT_WINDOW;
/// TCP keepalive unless the connection string sets it: a server host that
/// vanishes without a reset (a failover, a partition) is noticed in about
/// two minutes, where tokio-postgres's default idle time is two hours. The
/// dropped connection then ends the run and the dataflow connects again.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_RETRIES: u32 = 6;
/// tokio-postgres's own idle time, which a connection string never chose.
const DEFAULT_KEEPALIVE_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// libpq's `sslmode` values; tokio-postgres knows only the first three.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ssl {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The TLS settings of a connection string, taken out of it: the rest is
/// what tokio-postgres parses.
#[derive(Debug, PartialEq, Eq)]
struct Split {
    rest: String,
    ssl: Ssl,
    root_cert: Option<String>,
}

fn split(connection_string: &str) -> Result<Split, ConnectorError> {
    let bad = |what: &str| ConnectorError::Config(format!("connectionString: {what}"));
    let mode = |v: &str| match v {
        "disable" | "allow" => Ok(Ssl::Disable),
        "prefer" => Ok(Ssl::Prefer),
        "require" => Ok(Ssl::Require),
        "verify-ca" => Ok(Ssl::VerifyCa),
        "verify-full" => Ok(Ssl::VerifyFull),
        other => Err(bad(&format!(
            "sslmode {other:?} is not disable, prefer, require, verify-ca or verify-full"
        ))),
    };
    let (mut ssl, mut root_cert) = (Ssl::Prefer, None);
    if connection_string.starts_with("postgres://") || connection_string.starts_with("postgresql://") {
        let (base, query) = connection_string.split_once('?').unwrap_or((connection_string, ""));
        let mut kept = form_urlencoded::Serializer::new(String::new());
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "sslmode" => ssl = mode(&v)?,
                "sslrootcert" => root_cert = Some(v.into_owned()),
                _ => {
                    kept.append_pair(&k, &v);
                }
            }
        }
        // form encoding writes a space as `+` (a `+` itself as `%2B`),
        // which a URL's query (tokio-postgres's reading) keeps as `+`.
        let kept = kept.finish().replace('+', "%20");
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{kept}")
        };
        return Ok(Split { rest, ssl, root_cert });
    }
    static SETTING: LazyLock<regex_lite::Regex> = LazyLock::new(|| {
        regex_lite::Regex::new(r"(?:^|\s)(sslmode|sslrootcert)\s*=\s*('(?:[^'\\]|\\.)*'|\S*)").expect("static regex")
    });
    for caps in SETTING.captures_iter(connection_string) {
        let value = caps[2].trim_matches('\'').replace("\\'", "'");
        match &caps[1] {
            "sslmode" => ssl = mode(&value)?,
            _ => root_cert = Some(value),
        }
    }
    let rest = SETTING.replace_all(connection_string, "").into_owned();
    Ok(Split { rest, ssl, root_cert })
}

fn roots(egress: &EgressPolicy, root_cert: Option<&str>) -> Result<rustls::RootCertStore, ConnectorError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let path = match root_cert {
        Some(name) => egress.tls_file(name, "sslrootcert")?,
        None => SYSTEM_ROOTS.into(),
    };
    let mut store = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(&path)
        .map_err(|_| ConnectorError::Config("sslrootcert: cannot read the certificates".into()))?;
    for cert in certs {
        let cert = cert.map_err(|_| ConnectorError::Config("sslrootcert: not PEM certificates".into()))?;
        store
            .add(cert)
            .map_err(|_| ConnectorError::Config("sslrootcert: an unusable certificate".into()))?;
    }
    Ok(store)
}

/// Where and how to connect, from a connection string: its settings with
/// the host's address checked against the egress policy (no second lookup
/// later), and the TLS to use.
pub(crate) struct Target {
    pub config: tokio_postgres::Config,
    /// `None`: plain TCP (`sslmode=disable`).
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// `sslmode=prefer`: TLS if the server offers it, else plain.
    pub tls_optional: bool,
}

impl Target {
    pub async fn of(connection_string: &str, egress: &EgressPolicy) -> Result<Self, ConnectorError> {
        let Split { rest, ssl, root_cert } = split(connection_string)?;
        let mut config: tokio_postgres::Config = rest
            .parse()
            .map_err(|_| ConnectorError::Config("connectionString is not a PostgreSQL connection string".into()))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_keepalives_idle() == DEFAULT_KEEPALIVE_IDLE {
            config.keepalives_idle(KEEPALIVE_IDLE);
        }
        if config.get_keepalives_interval().is_none() {
            config.keepalives_interval(KEEPALIVE_INTERVAL);
        }
        if config.get_keepalives_retries().is_none() {
            config.keepalives_retries(KEEPALIVE_RETRIES);
        }
        let hosts = config.get_hosts().to_vec();
        if hosts.len() != 1 {
            return Err(ConnectorError::Config(
                "connectionString must name exactly one host".into(),
            ));
        }
        if config.get_hostaddrs().is_empty() {
            match &hosts[0] {
                Host::Tcp(name) => {
                    let port = config.get_ports().first().copied().unwrap_or(5432);
                    let addr = egress.resolve(name, port).await?[0];
                    config.hostaddr(addr.ip());
                }
                #[cfg(unix)]
                Host::Unix(_) if !egress.permits_local_sockets() => {
                    return Err(ConnectorError::Config(
                        "a Unix-socket host is not reachable here".into(),
                    ));
                }
                #[cfg(unix)]
                Host::Unix(_) => {}
            }
        } else {
            for ip in config.get_hostaddrs() {
                egress.check(*ip)?;
            }
        }
        let verify = match ssl {
            Ssl::Disable => None,
            Ssl::Prefer | Ssl::Require => Some(Verify::Nothing),
            Ssl::VerifyCa => Some(Verify::Chain),
            Ssl::VerifyFull => Some(Verify::Full),
        };
        config.ssl_mode(match ssl {
            Ssl::Disable => SslMode::Disable,
            Ssl::Prefer => SslMode::Prefer,
            _ => SslMode::Require,
        });
        let tls = match verify {
            None => None,
            Some(verify) => {
                let roots = match verify {
                    Verify::Nothing => rustls::RootCertStore::empty(),
                    _ => roots(egress, root_cert.as_deref())?,
                };
                let tls = tls::client_config(verify, roots).map_err(|e| ConnectorError::Config(format!("TLS: {e}")))?;
                Some(std::sync::Arc::new(tls))
            }
        };
        Ok(Self {
            config,
            tls,
            tls_optional: ssl == Ssl::Prefer,
        })
    }

    /// The time the connection's start may take: connect_timeout bounds
    /// the TCP connect only, so a port that accepts and never answers the
    /// startup (another protocol's server) is bounded with the same time.
    pub fn handshake_timeout(&self) -> Duration {
        self.config.get_connect_timeout().copied().unwrap_or(CONNECT_TIMEOUT)
    }
}

fn silent() -> ConnectorError {
    tracing::info!("PostgreSQL server silent through the connection's start");
    ConnectorError::unreachable_database()
}

/// Connects and drives the connection in the background.
pub async fn connect(connection_string: &str, egress: &EgressPolicy) -> Result<tokio_postgres::Client, ConnectorError> {
    connect_to(&Target::of(connection_string, egress).await?).await
}

/// Connects to a checked target and drives the connection in the background.
/// Within the handshake timeout, whatever the server does, and a failure to
/// reach it said only once that time has passed
/// ([`crate::egress::connecting`]).
pub(crate) async fn connect_to(target: &Target) -> Result<tokio_postgres::Client, ConnectorError> {
    let attempt = async {
        match &target.tls {
            None => spawn(target.config.connect(NoTls).await),
            Some(tls) => spawn(target.config.connect(MakeRustls(tls.clone())).await),
        }
        .map_err(ConnectorError::connect)
    };
    crate::egress::connecting(target.handshake_timeout(), attempt, silent).await
}

/// Drives a new connection in the background.
fn spawn<S, T>(
    connected: Result<(tokio_postgres::Client, tokio_postgres::Connection<S, T>), tokio_postgres::Error>,
) -> Result<tokio_postgres::Client, tokio_postgres::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (client, connection) = connected?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::warn!(error = %e, "PostgreSQL connection closed");
        }
    });
    Ok(client)
}

/// Any identifier as PostgreSQL quotes it (`"` doubled): for names read
/// from the catalog, which may hold any character.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `text` as an escape string literal, whatever `standard_conforming_strings` is.
pub fn literal(text: &str) -> String {
    format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

/// `name` or `schema.name`, each part `[A-Za-z_][A-Za-z0-9_]*`, quoted.
pub fn quote(name: &str) -> Result<String, ConnectorError> {
    let parts: Vec<&str> = name.split('.').collect();
    let valid = |p: &str| {
        p.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if parts.is_empty() || parts.len() > 2 || !parts.iter().all(|p| valid(p)) {
        return Err(ConnectorError::Config(format!(
            "{name:?} is not a table or column name ([A-Za-z_][A-Za-z0-9_]*, optionally schema.name)"
        )));
    }
    Ok(parts.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join("."))
}

#[cfg(test)]
mod tests {
    use super::{Split, Ssl, split};
    use crate::ConnectorError;
    use crate::egress::EgressPolicy;

    /// A port that accepts and never speaks (another protocol's server
    /// waiting for its client) hung a source in Pending for ever.
    #[tokio::test]
    async fn a_port_that_never_answers_the_startup_fails_within_the_connect_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        });
        let dsn = format!("host=127.0.0.1 port={port} user=x dbname=x sslmode=disable connect_timeout=1");
        let started = std::time::Instant::now();
        let outcome = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            super::connect(&dsn, &EgressPolicy::default()),
        )
        .await
        .expect("the connection attempt ended by itself");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        held.abort();
        // Said as a closed port's is said: no oracle of what listens.
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let refused = super::connect(
            &format!("host=127.0.0.1 port={closed} user=x dbname=x sslmode=disable connect_timeout=1"),
            &EgressPolicy::default(),
        )
        .await;
        match (outcome, refused) {
            (Err(ConnectorError::Connect(silent)), Err(ConnectorError::Connect(closed))) => {
                assert_eq!(silent, closed)
            }
            (a, b) => panic!("{:?} {:?}", a.map(drop), b.map(drop)),
        }
    }

    /// A Unix-socket host reaches this host's own server: refused where
    /// loopback is (and before any connection is tried), used where not.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_unix_socket_host_is_refused_where_loopback_is() {
        let dsn = "host=/var/run/postgresql user=postgres dbname=test sslmode=disable";
        for policy in [
            EgressPolicy::dev(vec![], vec!["127.0.0.0/8".parse().unwrap()], None),
            EgressPolicy::restricted(vec![], vec![], None),
        ] {
            match super::connect(dsn, &policy).await {
                Err(ConnectorError::Config(m)) => assert!(m.contains("Unix-socket"), "{m}"),
                Err(e) => panic!("{e:?}"),
                Ok(_) => panic!("a Unix socket was reached under {policy:?}"),
            }
        }
        // sless dev's own policy keeps them: the connection is tried (and
        // may still fail on the server's rules for local logins).
        if let Err(ConnectorError::Config(m)) = super::connect(dsn, &EgressPolicy::dev(vec![], vec![], None)).await {
            assert!(!m.contains("Unix-socket"), "{m}");
        }
    }

    /// Against the PostgreSQL of the tests (`SLESS_TEST_PG`): the kernel's
    /// keepalive timer on the connection's socket, read from
    /// `/proc/net/tcp`, fires within the minute, not after two hours.
    #[tokio::test]
    async fn a_connection_probes_a_silent_server_within_the_minute() {
        let dsn = std::env::var("SLESS_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1/test".into());
        let separator = if dsn.contains('?') { '&' } else { '?' };
        let client = super::connect(&format!("{dsn}{separator}sslmode=disable"), &Default::default())
            .await
            .unwrap();
        let port: i32 = client
            .query_one(
                "SELECT client_port FROM pg_stat_activity WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let sockets = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let local = format!(":{port:04X}");
        let socket: Vec<&str> = sockets
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|fields| fields.get(1).is_some_and(|address| address.ends_with(&local)))
            .expect("the connection's socket");
        // "tr:tm->when": timer 2 is keepalive, due in clock ticks (100 a second).
        let (timer, due) = socket[5].split_once(':').unwrap();
        let due = u64::from_str_radix(due, 16).unwrap();
        assert_eq!(timer, "02", "{socket:?}");
        assert!(due <= 60 * 100, "keepalive due in {} s", due / 100);
    }

    #[test]
    fn ssl_settings_come_out_of_both_forms() {
        let s = split("postgres://u:p@db.example:5432/app?sslmode=verify-full&sslrootcert=ca.pem&application_name=x")
            .unwrap();
        assert_eq!(
            s,
            Split {
                rest: "postgres://u:p@db.example:5432/app?application_name=x".into(),
                ssl: Ssl::VerifyFull,
                root_cert: Some("ca.pem".into())
            }
        );
        let s = split("host=db.example user=u sslmode = require  dbname=app").unwrap();
        assert_eq!(
            (s.ssl, s.rest.split_whitespace().collect::<Vec<_>>()),
            (Ssl::Require, vec!["host=db.example", "user=u", "dbname=app"])
        );
        let s = split("host=h sslrootcert='my ca.pem' sslmode=verify-ca").unwrap();
        assert_eq!((s.ssl, s.root_cert.as_deref()), (Ssl::VerifyCa, Some("my ca.pem")));
        assert_eq!(split("postgres://h/db").unwrap().ssl, Ssl::Prefer);
        assert!(split("postgres://h/db?sslmode=sometimes").is_err());
        // A space in another setting stays a space for tokio-postgres (a
        // `+` became a `+` in the setting's value, which the server refused).
        let s = split("postgres://h/db?sslmode=disable&options=-c%20a%3D1+b&application_name=a%2Bb").unwrap();
        let config: tokio_postgres::Config = s.rest.parse().unwrap();
        assert_eq!(config.get_options(), Some("-c a=1 b"));
        assert_eq!(config.get_application_name(), Some("a+b"));
    }

    #[test]
    fn quoting_refuses_injection() {
        assert_eq!(super::quote("orders").unwrap(), "\"orders\"");
        assert_eq!(super::quote("dwh.orders_2").unwrap(), "\"dwh\".\"orders_2\"");
        for bad in ["", "a.b.c", "x; drop table y", "1abc", "a\"b"] {
            assert!(super::quote(bad).is_err(), "{bad}");
        }
        assert_eq!(super::quote_ident(r#"a") DO NOTHING; --"#), r#""a"") DO NOTHING; --""#);
    }
}
