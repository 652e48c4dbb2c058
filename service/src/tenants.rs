//! Bearer tokens → tenants. A token maps to exactly one tenant; tokens are
//! kept only as SHA-256 digests, so a dump of this process holds none.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use sless_model::name::DnsLabel;
use sless_runtime::sync::Unpoisoned;

/// Shortest accepted token: 16 characters, ~96 bits if random base64.
pub const MIN_TOKEN_LEN: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum TenantConfigError {
    #[error("cannot read tenants file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("tenants file {path} is invalid: {source}")]
    Parse { path: String, source: Box<toml::de::Error> },
    #[error("tenant {tenant:?}: {message}")]
    Invalid { tenant: String, message: String },
    #[error("--tenant expects ID=TOKEN, got {0:?}")]
    Flag(String),
}

/// Where `sless dev` and `sless serve` take their tenants from: the same
/// flags, loaded the same way.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TenantArgs {
    /// TOML file of tenants and their API tokens: [[tenant]] id = "acme",
    /// token_sha256 = "<hex>" (or token = "...").
    #[arg(long, env = "SLESS_TENANTS_FILE")]
    pub tenants_file: Option<PathBuf>,
    /// Extra tenant as ID=TOKEN (token at least 16 characters); repeatable.
    #[arg(long = "tenant", value_name = "ID=TOKEN")]
    pub tenants: Vec<String>,
}

impl TenantArgs {
    /// Adds the file's tenants, then the flags', to `tenants`.
    pub fn load_into(&self, tenants: &mut Tenants) -> Result<(), TenantConfigError> {
        if let Some(path) = &self.tenants_file {
            tenants.add_file(path)?;
        }
        for flag in &self.tenants {
            tenants.add_flag(flag)?;
        }
        Ok(())
    }
}

/// One entry of the tenants file:
///
/// ```toml
/// [[tenant]]
/// id = "acme"
/// token = "a-long-random-token"        # or
/// token_sha256 = "<hex sha-256 of the token>"
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    id: String,
    token: Option<String>,
    token_sha256: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantsFile {
    #[serde(default)]
    tenant: Vec<TenantEntry>,
}

type Digest32 = [u8; 32];

/// The token directory used by the API's auth middleware.
#[derive(Debug, Default, Clone)]
pub struct Tenants {
    by_digest: HashMap<Digest32, DnsLabel>,
}

fn digest(token: &str) -> Digest32 {
    Sha256::digest(token.as_bytes()).into()
}

impl Tenants {
    /// The tenant a presented token belongs to.
    pub fn authenticate(&self, token: &str) -> Option<&DnsLabel> {
        self.by_digest.get(&digest(token))
    }

    /// How many tokens are known.
    pub fn len(&self) -> usize {
        self.by_digest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// Adds a tenant with a plaintext token.
    pub fn add(&mut self, id: &str, token: &str) -> Result<(), TenantConfigError> {
        if token.len() < MIN_TOKEN_LEN {
            return Err(invalid(
                id,
                format!("token must be at least {MIN_TOKEN_LEN} characters"),
            ));
        }
        self.add_digest(id, digest(token))
    }

    fn add_digest(&mut self, id: &str, digest: Digest32) -> Result<(), TenantConfigError> {
        let tenant = sless_model::name::tenant_id(id, "id").map_err(|e| invalid(id, e.message))?;
        match self.by_digest.get(&digest) {
            Some(other) if *other != tenant => Err(invalid(
                id,
                format!("its token is already the token of tenant {other:?}"),
            )),
            _ => {
                self.by_digest.insert(digest, tenant);
                Ok(())
            }
        }
    }

    /// Adds `ID=TOKEN` as given on the command line.
    pub fn add_flag(&mut self, flag: &str) -> Result<(), TenantConfigError> {
        let (id, token) = flag
            .split_once('=')
            .ok_or_else(|| TenantConfigError::Flag(flag.into()))?;
        self.add(id, token)
    }

    /// Adds every tenant of a TOML tenants file.
    pub fn add_file(&mut self, path: &Path) -> Result<(), TenantConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TenantConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        let file: TenantsFile = toml::from_str(&text).map_err(|source| TenantConfigError::Parse {
            path: shown,
            source: Box::new(source),
        })?;
        for entry in file.tenant {
            match (&entry.token, &entry.token_sha256) {
                (Some(token), None) => self.add(&entry.id, token)?,
                (None, Some(hex)) => self.add_digest(
                    &entry.id,
                    parse_hex_digest(hex)
                        .ok_or_else(|| invalid(&entry.id, "token_sha256 must be 64 hex digits".into()))?,
                )?,
                _ => return Err(invalid(&entry.id, "give exactly one of token and token_sha256".into())),
            }
        }
        Ok(())
    }
}

/// The tenants in force. A reload replaces them whole, so a request sees
/// either the old set or the new one.
#[derive(Debug, Default)]
pub struct Directory(RwLock<Arc<Tenants>>);

impl Directory {
    pub fn new(tenants: Tenants) -> Self {
        Self(RwLock::new(Arc::new(tenants)))
    }

    pub fn current(&self) -> Arc<Tenants> {
        self.0.read_unpoisoned().clone()
    }

    fn replace(&self, tenants: Tenants) {
        *self.0.lock_unpoisoned() = Arc::new(tenants);
    }
}

/// How often `sless serve` looks at its tenants file (a mounted Secret,
/// which the kubelet updates in place).
pub const RELOAD_EVERY: Duration = Duration::from_secs(5);

/// Loads `args` again into `directory` whenever the tenants file's content
/// changes, until `stop` turns true. A file that does not load (half
/// written, invalid) keeps the tenants in force, and says why.
pub async fn reload(
    args: TenantArgs,
    directory: Arc<Directory>,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let Some(path) = args.tenants_file.clone() else {
        return;
    };
    let read = |path: PathBuf| async move {
        tokio::task::spawn_blocking(move || std::fs::read(path).ok())
            .await
            .ok()
            .flatten()
    };
    // The first look loads the file again: what it held at start is not
    // known here, and loading the same tenants twice changes nothing.
    let mut loaded = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let now = read(path.clone()).await;
        if now == loaded {
            continue;
        }
        let args = args.clone();
        let fresh = tokio::task::spawn_blocking(move || {
            let mut tenants = Tenants::default();
            args.load_into(&mut tenants).map(|()| tenants)
        })
        .await;
        match fresh {
            Ok(Ok(tenants)) => {
                tracing::info!(tenants = tenants.len(), "tenants reloaded");
                directory.replace(tenants);
                loaded = now;
            }
            Ok(Err(e)) => tracing::error!(error = %e, "the tenants file does not load; the tenants in force stay"),
            Err(e) => tracing::error!(error = %e, "reloading the tenants failed"),
        }
    }
}

fn invalid(tenant: &str, message: String) -> TenantConfigError {
    TenantConfigError::Invalid {
        tenant: tenant.into(),
        message,
    }
}

fn parse_hex_digest(hex: &str) -> Option<Digest32> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_map_to_one_tenant() {
        let mut t = Tenants::default();
        t.add_flag("acme=aaaaaaaaaaaaaaaa").unwrap();
        t.add("beta", "bbbbbbbbbbbbbbbb").unwrap();
        assert_eq!(t.authenticate("aaaaaaaaaaaaaaaa").unwrap().as_str(), "acme");
        assert_eq!(t.authenticate("bbbbbbbbbbbbbbbb").unwrap().as_str(), "beta");
        assert!(t.authenticate("cccccccccccccccc").is_none());
        assert!(
            t.add("gamma", "aaaaaaaaaaaaaaaa").is_err(),
            "a token cannot serve two tenants"
        );
        assert!(t.add("gamma", "short").is_err());
        assert!(t.add("Bad_Id", "dddddddddddddddd").is_err());
        assert!(t.add_flag("no-equals-sign").is_err());
    }

    /// One tenant-id rule at its bounds: the flag (and so the file, the
    /// REST API and everything behind it) takes what the QueueService CRD
    /// takes and refuses what its namespace could not hold.
    #[test]
    fn tenant_ids_are_checked_at_their_bounds() {
        let mut t = Tenants::default();
        let longest = "t".repeat(sless_model::name::MAX_TENANT_LEN);
        for (i, id) in ["a", "ab", longest.as_str()].into_iter().enumerate() {
            t.add(id, &format!("token-{i}-0123456789abcdef")).unwrap();
        }
        let e = t
            .add(&format!("{longest}t"), "token-x-0123456789abcdef")
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 54 characters"), "{e}");
    }

    /// A changed file is taken up while serving; a broken one is not.
    #[tokio::test]
    async fn the_tenants_file_is_reloaded_and_a_broken_one_keeps_the_tenants() {
        let path = std::env::temp_dir().join(format!("sless-reload-{}-{}.toml", std::process::id(), rand_suffix()));
        let entry = |token: &str| format!("[[tenant]]\nid = \"acme\"\ntoken = \"{token}\"\n");
        std::fs::write(&path, entry("first-token-0123456")).unwrap();
        let args = TenantArgs {
            tenants_file: Some(path.clone()),
            tenants: vec![],
        };
        let mut first = Tenants::default();
        args.load_into(&mut first).unwrap();
        let directory = Arc::new(Directory::new(first));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let every = Duration::from_millis(20);
        let task = tokio::spawn(reload(args, directory.clone(), every, stopped));
        std::fs::write(&path, entry("second-token-012345")).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while directory.current().authenticate("second-token-012345").is_none() {
            assert!(std::time::Instant::now() < deadline, "the new file was never taken up");
            tokio::time::sleep(every).await;
        }
        assert!(
            directory.current().authenticate("first-token-0123456").is_none(),
            "the old token is gone"
        );
        std::fs::write(&path, entry("short")).unwrap();
        tokio::time::sleep(every * 10).await;
        assert!(
            directory.current().authenticate("second-token-012345").is_some(),
            "a file that does not load changes nothing"
        );
        stop.send_replace(true);
        task.await.unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    fn rand_suffix() -> u64 {
        u64::from_le_bytes(sless_runtime::random::bytes::<8>())
    }

    #[test]
    fn tenants_file_with_plain_and_hashed_tokens() {
        let path = std::env::temp_dir().join(format!("sless-tenants-{}.toml", std::process::id()));
        let hashed: String = digest("hashed-token-0123").iter().map(|b| format!("{b:02x}")).collect();
        std::fs::write(
            &path,
            format!("[[tenant]]\nid = \"acme\"\ntoken = \"plain-token-01234\"\n[[tenant]]\nid = \"beta\"\ntoken_sha256 = \"{hashed}\"\n"),
        )
        .unwrap();
        let mut t = Tenants::default();
        t.add_file(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(t.authenticate("plain-token-01234").unwrap().as_str(), "acme");
        assert_eq!(t.authenticate("hashed-token-0123").unwrap().as_str(), "beta");
    }
}
