//! Where a dataflow's connectors may connect, and which files they may read.
//!
//! A tenant names the hosts of its sources and sinks: without a policy it
//! could reach the platform's own network (a database on loopback, the
//! cloud metadata service) and use the differences between errors as a port
//! scanner, and a Kafka `tls.caFile` could read any file of the host. The
//! processor therefore resolves every host itself, checks each address
//! against the policy, and connects only to the address it checked (no
//! second lookup to rebind); TLS files are read only from the platform's
//! TLS directory. Refusals name neither the address nor the file.
//!
//! HTTP connectors follow no redirect (a permitted host could otherwise
//! send them anywhere the policy denies) and read every answer through a
//! cap fitting its protocol ([`read_answer`]); what a remote server says in
//! an error body is not passed on to the tenant, only its status and, where
//! the protocol has one, a known error code.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::ConnectorError;

/// A network: an address and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (addr, prefix) = text.split_once('/').unwrap_or((text, ""));
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{text:?} is not an address or CIDR"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = if prefix.is_empty() {
            max
        } else {
            prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{text:?} has no prefix length of 0..={max}"))?
        };
        Ok(Self { addr, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Cidr {
    /// Whether it is an IPv4 network.
    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let ip = match (self.addr, ip) {
            // An IPv4-mapped IPv6 address is its IPv4 address.
            (IpAddr::V4(_), IpAddr::V6(v6)) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            _ => ip,
        };
        let (net, ip, width) = match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(i)) => (u128::from(u32::from(n)), u128::from(u32::from(i)), 32),
            (IpAddr::V6(n), IpAddr::V6(i)) => (u128::from(n), u128::from(i), 128),
            _ => return false,
        };
        let mask = match self.prefix {
            0 => 0,
            p => u128::MAX << (width - u32::from(p)),
        };
        (net ^ ip) & mask == 0
    }
}

/// Networks no dataflow reaches in any mode unless `--egress-allow` names
/// them: link-local (the cloud metadata service at 169.254.169.254),
/// unspecified and multicast addresses.
pub const ALWAYS_DENY: &[&str] = &[
    "169.254.0.0/16",
    "fe80::/10",
    "0.0.0.0/8",
    "::/128",
    "224.0.0.0/4",
    "ff00::/8",
];

/// This host, denied beside [`ALWAYS_DENY`] outside `sless dev`. A policy
/// that denies it also denies Unix-socket database hosts.
pub const LOOPBACK: &[&str] = &["127.0.0.0/8", "::1/128"];

/// Where `sless processor` reads TLS files unless told otherwise: the
/// operator mounts a DataFlow's TLS secrets there.
pub const PROCESSOR_TLS_DIR: &str = "/etc/dataflow-tls";

/// The egress flags of `sless dev` and `sless processor`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EgressArgs {
    /// A network (CIDR) dataflows may reach although denied; repeatable.
    #[arg(long = "egress-allow", value_name = "CIDR")]
    pub allow: Vec<Cidr>,
    /// A network (CIDR) no dataflow may reach, beside the defaults
    /// (link-local, unspecified and multicast always; loopback outside
    /// sless dev); repeatable. Denying loopback also denies Unix sockets.
    #[arg(long = "egress-deny", value_name = "CIDR")]
    pub deny: Vec<Cidr>,
    /// The directory TLS files of connectors are read from (Kafka tls.caFile,
    /// certFile, keyFile; PostgreSQL sslrootcert); no other file is read.
    #[arg(long = "tls-dir", value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
}

/// Which networks connectors may reach. `Default` permits everything: it
/// is for tests whose servers run on loopback, never for a platform.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    /// Reachable even inside `deny`.
    pub allow: Vec<Cidr>,
    pub deny: Vec<Cidr>,
    /// The only directory TLS files are read from; none: no TLS files.
    pub tls_dir: Option<PathBuf>,
}

fn cidrs(list: &[&str]) -> impl Iterator<Item = Cidr> {
    list.iter().filter_map(|c| c.parse().ok())
}

impl EgressPolicy {
    /// The production policy (`sless processor`): [`ALWAYS_DENY`],
    /// [`LOOPBACK`] and `deny`, except `allow`.
    pub fn restricted(allow: Vec<Cidr>, deny: Vec<Cidr>, tls_dir: Option<PathBuf>) -> Self {
        Self {
            allow,
            deny: cidrs(ALWAYS_DENY).chain(cidrs(LOOPBACK)).chain(deny).collect(),
            tls_dir,
        }
    }

    /// `sless dev`'s policy, on the developer's own machine: loopback and
    /// the local networks stay reachable, [`ALWAYS_DENY`] and `deny` do
    /// not, except `allow`.
    pub fn dev(allow: Vec<Cidr>, deny: Vec<Cidr>, tls_dir: Option<PathBuf>) -> Self {
        Self {
            allow,
            deny: cidrs(ALWAYS_DENY).chain(deny).collect(),
            tls_dir,
        }
    }

    /// Whether Unix-socket hosts may be used: they reach this host's own
    /// servers, so only where loopback is permitted.
    pub fn permits_local_sockets(&self) -> bool {
        self.permits(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
            && self.permits(IpAddr::V6(std::net::Ipv6Addr::LOCALHOST))
    }

    pub fn permits(&self, ip: IpAddr) -> bool {
        self.allow.iter().any(|c| c.contains(ip)) || !self.deny.iter().any(|c| c.contains(ip))
    }

    /// [`Self::permits`] as the error a connector reports.
    pub fn check(&self, ip: IpAddr) -> Result<(), ConnectorError> {
        if self.permits(ip) { Ok(()) } else { Err(refused()) }
    }

    /// Resolves `host:port` and returns the addresses the policy permits;
    /// an error when there are none.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, ConnectorError> {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|_| ConnectorError::Connect(format!("cannot resolve the host {host:?}")))?
            .collect();
        let permitted: Vec<SocketAddr> = addrs.into_iter().filter(|a| self.permits(a.ip())).collect();
        if permitted.is_empty() {
            return Err(refused());
        }
        Ok(permitted)
    }

    /// An HTTP client for `url` that connects only to the addresses of its
    /// host the policy permits (resolved once here, never again), with
    /// [`CONNECT_WINDOW`] to connect and `timeout` for a whole request. It follows
    /// no redirect and takes no proxy from the environment: either would
    /// be a hop the policy never checked.
    pub async fn http_client(&self, url: &str, timeout: Duration) -> Result<reqwest::Client, ConnectorError> {
        self.http_client_with(url, timeout, crate::tls::HttpTls::default())
            .await
    }

    /// As [`Self::http_client`], trusting and presenting what `tls` holds.
    pub async fn http_client_with(
        &self,
        url: &str,
        timeout: Duration,
        tls: crate::tls::HttpTls,
    ) -> Result<reqwest::Client, ConnectorError> {
        let (host, port, https) = http_endpoint(url).map_err(|e| ConnectorError::Config(e.into()))?;
        let addrs = self.resolve(&host, port).await?;
        if https {
            sless_runtime::tls::install_default_provider();
        }
        let mut builder = reqwest::Client::builder()
            .resolve_to_addrs(&host, &addrs)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .proxy(fence(host.clone(), port))
            .connect_timeout(CONNECT_WINDOW)
            .timeout(timeout)
            .danger_accept_invalid_certs(tls.insecure);
        for root in tls.roots {
            builder = builder.add_root_certificate(root);
        }
        if let Some(identity) = tls.identity {
            builder = builder.identity(identity);
        }
        builder.build().map_err(|e| ConnectorError::Config(e.to_string()))
    }

    /// The path of TLS file `name` (relative to the TLS directory, or
    /// absolute inside it), checked before anything is read.
    pub fn tls_file(&self, name: &str, field: &str) -> Result<PathBuf, ConnectorError> {
        // The directory is the platform's: its path is not the tenant's to know.
        let outside = || ConnectorError::Config(format!("{field} must name a file of the platform's TLS directory"));
        let dir = self.tls_dir.as_ref().ok_or_else(outside)?;
        let path = Path::new(name);
        let relative = if path.is_absolute() {
            path.strip_prefix(dir).map_err(|_| outside())?
        } else {
            path
        };
        // No way out: only plain names below the directory.
        if relative
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(outside());
        }
        let joined = dir.join(relative);
        // A link inside the directory must not lead out of it either.
        match (joined.canonicalize(), dir.canonicalize()) {
            (Ok(real), Ok(root)) if real.starts_with(&root) => Ok(real),
            (Ok(_), Ok(_)) => Err(outside()),
            _ => Err(ConnectorError::Config(format!(
                "{field}: no such file in the TLS directory"
            ))),
        }
    }
}

/// Where a client of [`EgressPolicy::http_client`] sends a request for any
/// other host or port than the one the policy checked: a loopback port
/// nothing listens on, so the request fails there. A library the client is
/// lent to may follow a URL the remote side gave it (Iceberg's REST catalog
/// takes a `uri` from the server's `/v1/config`); an address literal would
/// never reach the pinned resolver, and a name would reach the system's.
const FENCE: &str = "http://127.0.0.1:1";

/// The proxy rule that lets requests for `host:port` through and fences
/// every other destination off ([`FENCE`]).
fn fence(host: String, port: u16) -> reqwest::Proxy {
    reqwest::Proxy::custom(move |url| {
        let allowed = url
            .host_str()
            .is_some_and(|h| h.trim_start_matches('[').trim_end_matches(']') == host)
            && url.port_or_known_default() == Some(port);
        if !allowed {
            tracing::warn!(destination = %url.host_str().unwrap_or_default(), "a request for a host the egress policy did not check was refused");
        }
        (!allowed).then_some(FENCE)
    })
}

pub use sless_runtime::http::Answer;

use crate::budget::{Allowance, Held};

/// Reads `response` of the remote service `what` (such as `"SQS"`) within
/// `cap` bytes ([`sless_runtime::http::read_capped`]), as a connector's
/// error: a redirect is the spec's to fix ([`EgressPolicy::http_client`]
/// follows none, and its target was never checked), an answer too long
/// may be retried.
pub async fn read_answer(response: reqwest::Response, cap: usize, what: &str) -> Result<Answer, ConnectorError> {
    sless_runtime::http::read_capped(response, cap)
        .await
        .map_err(|e| answer_error(e, what))
}

/// As [`read_answer`], holding the answer's bytes of `memory` as they
/// arrive, until the [`Held`] returned with it drops: a tenant's flows
/// together hold no more answers than its budget.
pub async fn read_answer_held(
    response: reqwest::Response,
    cap: usize,
    what: &str,
    memory: &Allowance,
) -> Result<(Answer, Held), ConnectorError> {
    let mut held = memory.hold(0)?;
    let answer = sless_runtime::http::read_capped_each(response, cap, |bytes| {
        held.grow(bytes as u64).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| answer_error(e, what))?;
    Ok((answer, held))
}

fn answer_error(e: sless_runtime::http::ReadError, what: &str) -> ConnectorError {
    use sless_runtime::http::ReadError;
    match e {
        ReadError::Redirect(_) => ConnectorError::Config(format!("{what} {e}")),
        ReadError::TooLong(_) => ConnectorError::Transient(format!("{what} {e}")),
        ReadError::Transport(_) => ConnectorError::Connect(format!("{what}: {e}")),
        ReadError::Refused(reason) => ConnectorError::Transient(format!("{what}'s answer: {reason}")),
    }
}

/// How long a connector's first exchange with a server (connecting, and
/// the first answer that shows what listens there) may take, and how long
/// one that fails to reach it takes to say so, whatever the target does:
/// refuses the connection, stays silent, or speaks another protocol. So
/// the time of a failure tells a tenant nothing about what listens at an
/// address (a port scan through a dataflow learns nothing from it).
pub const CONNECT_WINDOW: Duration = Duration::from_secs(10);

/// Runs `attempt` within `window`: past it, `silent()` is the error; an
/// error of [`ConnectorError::Connect`] (the server was not reached as
/// what the spec says) is returned only once `window` has passed since the
/// attempt began. Any other outcome returns as soon as it is known.
pub async fn connecting<T>(
    window: Duration,
    attempt: impl std::future::Future<Output = Result<T, ConnectorError>>,
    silent: impl FnOnce() -> ConnectorError,
) -> Result<T, ConnectorError> {
    let started = tokio::time::Instant::now();
    let outcome = match tokio::time::timeout(window, attempt).await {
        Ok(outcome) => outcome,
        Err(_) => Err(silent()),
    };
    if matches!(outcome, Err(ConnectorError::Connect(_))) {
        tokio::time::sleep_until(started + window).await;
    }
    outcome
}

/// `(host, port, https)` of an HTTP endpoint a spec names.
pub fn http_endpoint(url: &str) -> Result<(String, u16, bool), &'static str> {
    let parsed = reqwest::Url::parse(url).map_err(|_| "must be an http:// or https:// URL")?;
    let https = match parsed.scheme() {
        "https" => true,
        "http" => false,
        _ => return Err("must be an http:// or https:// URL"),
    };
    // An IPv6 literal without its brackets: an address, resolved as itself.
    let host = parsed.host_str().ok_or("must name a host")?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
        .to_owned();
    let port = parsed.port_or_known_default().ok_or("must name a port")?;
    Ok((host, port, https))
}

fn refused() -> ConnectorError {
    ConnectorError::Config("the host is not reachable under the platform's egress policy".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn networks() {
        let net: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(net.contains(ip("10.1.200.3")));
        assert!(!net.contains(ip("10.2.0.1")));
        assert!(!net.contains(ip("::1")));
        let v6: Cidr = "fe80::/10".parse().unwrap();
        assert!(v6.contains(ip("fe80::1")) && !v6.contains(ip("2001:db8::1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("8.8.8.8")));
        let host: Cidr = "192.0.2.7".parse().unwrap();
        assert!(host.contains(ip("192.0.2.7")) && !host.contains(ip("192.0.2.8")));
        for bad in ["10.0.0.0/33", "x", "::/129", "1.2.3.4/-1"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_default_policy_keeps_tenants_off_the_platform() {
        let policy = EgressPolicy::restricted(vec![], vec!["10.96.0.0/12".parse().unwrap()], None);
        for denied in [
            "127.0.0.1",
            "127.5.5.5",
            "::1",
            "169.254.169.254",
            "::ffff:127.0.0.1",
            "10.96.0.10",
            "0.0.0.0",
        ] {
            assert!(!policy.permits(ip(denied)), "{denied}");
        }
        for permitted in ["203.0.113.9", "10.0.0.5", "2001:db8::1"] {
            assert!(policy.permits(ip(permitted)), "{permitted}");
        }
        let policy = EgressPolicy::restricted(vec!["127.0.0.1/32".parse().unwrap()], vec![], None);
        assert!(policy.permits(ip("127.0.0.1")) && !policy.permits(ip("127.0.0.2")));
        assert!(!policy.permits_local_sockets(), "::1 is still denied");
    }

    #[test]
    fn sless_dev_keeps_loopback_but_not_the_metadata_service() {
        let policy = EgressPolicy::dev(vec![], vec![], None);
        for denied in [
            "169.254.169.254",
            "::ffff:169.254.169.254",
            "fe80::1",
            "0.0.0.0",
            "::",
            "224.0.0.1",
        ] {
            assert!(!policy.permits(ip(denied)), "{denied}");
        }
        for permitted in ["127.0.0.1", "::1", "10.0.0.5", "192.168.1.2"] {
            assert!(policy.permits(ip(permitted)), "{permitted}");
        }
        assert!(policy.permits_local_sockets());
        // Allowed explicitly, the metadata service is reachable.
        let policy = EgressPolicy::dev(vec!["169.254.169.254/32".parse().unwrap()], vec![], None);
        assert!(policy.permits(ip("169.254.169.254")));
        // Denying loopback denies Unix sockets too.
        for deny in ["127.0.0.0/8", "::1", "0.0.0.0/0"] {
            let policy = EgressPolicy::dev(vec![], vec![deny.parse().unwrap()], None);
            assert!(!policy.permits_local_sockets(), "{deny}");
        }
        assert!(!EgressPolicy::restricted(vec![], vec![], None).permits_local_sockets());
    }

    #[tokio::test]
    async fn a_refusal_names_no_address() {
        let policy = EgressPolicy::restricted(vec![], vec![], None);
        let e = policy.resolve("localhost", 5432).await.unwrap_err().to_string();
        assert!(!e.contains("127.0.0.1") && !e.contains("5432"), "{e}");
        assert!(EgressPolicy::default().resolve("localhost", 5432).await.is_ok());
    }

    #[test]
    fn tls_files_only_from_the_tls_directory() {
        let dir = std::env::temp_dir().join(format!("sless-tls-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.pem"), "x").unwrap();
        let policy = EgressPolicy::restricted(vec![], vec![], Some(dir.clone()));
        assert_eq!(
            policy.tls_file("ca.pem", "tls.caFile").unwrap(),
            dir.canonicalize().unwrap().join("ca.pem")
        );
        let inside = dir.join("ca.pem");
        assert!(policy.tls_file(inside.to_str().unwrap(), "tls.caFile").is_ok());
        // Existing or not, a path outside gets the same answer.
        let outside = |p: &str| policy.tls_file(p, "tls.caFile").unwrap_err().to_string();
        assert_eq!(outside("/etc/shadow"), outside("/etc/no-such-file"));
        assert_eq!(outside("../../etc/passwd"), outside("/etc/no-such-file"));
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink("/etc/hostname", dir.join("link.pem")).unwrap();
            assert_eq!(outside("link.pem"), outside("/etc/no-such-file"));
        }
        assert!(EgressPolicy::default().tls_file("ca.pem", "tls.caFile").is_err());
        assert!(
            !outside("/etc/shadow").contains(dir.to_str().unwrap()),
            "the refusal names the directory"
        );
    }
}
