//! Hosts of their own for fault tests: a network namespace per host, each
//! with one address on a bridge the test makes (the test process, in the
//! root namespace, reaches every host through the bridge), and links
//! between hosts that can be cut and healed. Needs root and `ip`.
//!
//! A cut is silent, as a real partition is: each side is told the other's
//! address is at a hardware address no one has, so its frames go nowhere
//! and connections time out rather than fail fast. (This kernel has
//! neither tc's drop action nor netem; a blackhole route would fail
//! `connect` at once.) The clients' links to the hosts stay up.

use std::net::Ipv4Addr;
use std::process::Command;

/// A hardware address no interface has.
const NOWHERE: &str = "02:00:00:00:00:01";

pub struct Network {
    tag: String,
    subnet: [u8; 3],
    hosts: usize,
}

impl Network {
    /// Makes `hosts` hosts, numbered from 1, on a /24 of 10.253.0.0/16
    /// picked by process id (the test cluster of `scripts/cluster.sh`
    /// routes 10.250–10.252, and kube-proxy drops what it sends there). Panics (naming the command) when it cannot,
    /// for instance without root.
    pub fn new(hosts: usize) -> Self {
        assert!(hosts < 250);
        remove_leftovers();
        let pid = std::process::id();
        let network = Self {
            tag: format!("slf{pid}"),
            subnet: [10, 253, (pid % 250) as u8],
            hosts,
        };
        let bridge = network.tag.clone();
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&["addr", "add", &format!("{}/24", network.addr_of(254)), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        for host in 1..=hosts {
            let ns = network.namespace(host);
            let veth = format!("{}v{host}", network.tag);
            ip(&["netns", "add", &ns]);
            ip(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ]);
            ip(&["link", "set", &veth, "master", &bridge, "up"]);
            let addr = format!("{}/24", network.addr(host));
            ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        network
    }

    fn addr_of(&self, last: u8) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, last)
    }

    /// Host `host`'s address.
    pub fn addr(&self, host: usize) -> Ipv4Addr {
        self.addr_of(host as u8)
    }

    fn namespace(&self, host: usize) -> String {
        format!("{}-{host}", self.tag)
    }

    /// A command that runs `program` on host `host` (as its own process:
    /// `ip netns exec` execs it).
    pub fn command(&self, host: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.namespace(host)]).arg(program);
        command
    }

    /// Cuts the link between hosts `a` and `b`, both ways.
    pub fn cut(&self, a: usize, b: usize) {
        for (from, to) in [(a, b), (b, a)] {
            let to = self.addr(to).to_string();
            let ns = self.namespace(from);
            ip(&[
                "-n",
                &ns,
                "neigh",
                "replace",
                &to,
                "lladdr",
                NOWHERE,
                "nud",
                "permanent",
                "dev",
                "eth0",
            ]);
        }
    }

    /// Cuts `host` off from every other host.
    pub fn isolate(&self, host: usize) {
        for other in (1..=self.hosts).filter(|h| *h != host) {
            self.cut(host, other);
        }
    }

    /// Heals every cut.
    pub fn heal(&self) {
        for host in 1..=self.hosts {
            let ns = self.namespace(host);
            // Only the cuts' entries are permanent; the rest are learnt.
            let _ = Command::new("ip")
                .args(["-n", &ns, "neigh", "flush", "dev", "eth0", "nud", "permanent"])
                .status();
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for host in 1..=self.hosts {
            let _ = Command::new("ip")
                .args(["netns", "delete", &self.namespace(host)])
                .status();
        }
        let _ = Command::new("ip").args(["link", "delete", &self.tag]).status();
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip {args:?}: {e}"));
    assert!(
        out.status.success(),
        "ip {}: {} (fault tests make network namespaces and need root)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Removes the namespaces and bridges of earlier runs whose process is gone
/// (a test killed before its drop ran).
fn remove_leftovers() {
    let alive = |tag: &str| {
        tag.strip_prefix("slf")
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_none_or(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
    };
    // The `column`th word of each line `ip args` prints.
    let listed = |args: &[&str], column: usize| -> Vec<String> {
        Command::new("ip")
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(column).map(str::to_owned))
            .collect()
    };
    for ns in listed(&["netns", "list"], 0) {
        if let Some((tag, _)) = ns.split_once('-')
            && tag.starts_with("slf")
            && !alive(tag)
        {
            let _ = Command::new("ip").args(["netns", "delete", &ns]).status();
        }
    }
    for link in listed(&["-o", "link", "show", "type", "bridge"], 1) {
        let name = link.trim_end_matches(':');
        if name.starts_with("slf") && !name.contains('-') && !alive(name) {
            let _ = Command::new("ip").args(["link", "delete", name]).status();
        }
    }
}
