//! What the Nessie source and sink share: the config, as the upstream
//! DataFlow operator names it (`nessieUrl`, `branch`, `namespace`, `table`,
//! `token`, the `aws…` settings of the object store), and a connection to
//! one Iceberg table of a Nessie branch through Nessie's Iceberg REST
//! catalog (`{server}/iceberg/{branch}`), with Apache Iceberg's Rust
//! implementation. Files go to the table's object store through
//! [`crate::s3`]; the catalog and the store are reached only through the
//! egress policy.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use iceberg::table::Table;
use iceberg::{Catalog, CatalogBuilder, ErrorKind, Namespace, NamespaceIdent, TableCommit, TableCreation, TableIdent};
use iceberg_catalog_rest::{RestCatalog, RestCatalogBuilder};
use serde::Deserialize;
use sless_model::dataflow::{Role, SecretRef};
use sless_model::{FieldError, ValidationErrors};

use crate::ConnectorError;
use crate::component::{either, inline, non_empty, secret_ref};
use crate::context::PipelineContext;
use crate::egress::http_endpoint;
use crate::s3::{S3Settings, S3StoreFactory};
use crate::tls::TlsConfig;

/// `config` of a `nessie` source or sink. Its `Debug` leaves out the
/// token, the password and the secret key.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NessieConfig {
    /// The Nessie server: `http[s]://host:port`, optionally with its API
    /// path (`/api/v2`, as upstream's examples give it) or `/iceberg`.
    pub nessie_url: Option<String>,
    /// The Nessie branch. Default `main`.
    pub branch: Option<String>,
    /// The table's namespace; levels separated by dots (`a.b`).
    pub namespace: Option<String>,
    pub table: Option<String>,
    /// Bearer authentication (HTTPS only).
    pub token: Option<String>,
    /// Basic authentication of `user` with `password` (HTTPS only).
    pub user: Option<String>,
    pub password: Option<String>,
    pub tls: Option<TlsConfig>,
    /// The warehouse Nessie keeps the table's files in. Default: Nessie's.
    pub warehouse: Option<String>,
    /// The object store's region, keys and endpoint (an S3-compatible store
    /// such as MinIO). Default: what the catalog configures.
    pub aws_region: Option<String>,
    #[serde(rename = "awsAccessKeyID")]
    pub aws_access_key_id: Option<String>,
    pub aws_secret_access_key: Option<String>,
    #[serde(rename = "awsEndpointURL")]
    pub aws_endpoint_url: Option<String>,
    /// Source: seconds between polls for new snapshots. Default 5.
    pub poll_interval: Option<u32>,
    /// Source: rows handed out at once (default 1000).
    pub batch_size: Option<u32>,
    /// Sink: creates the namespace when it does not exist. Default true.
    pub auto_create_namespace: Option<bool>,
    /// Sink: creates the table (`data string`, each message whole as JSON)
    /// when it does not exist.
    pub auto_create_table: Option<bool>,
    /// Sink: the batch and the source position in one snapshot (default on
    /// where the source can resume from it).
    pub exactly_once: Option<bool>,
    #[serde(rename = "nessieUrlSecretRef")]
    pub nessie_url_secret_ref: Option<SecretRef>,
    pub branch_secret_ref: Option<SecretRef>,
    pub namespace_secret_ref: Option<SecretRef>,
    pub table_secret_ref: Option<SecretRef>,
    pub token_secret_ref: Option<SecretRef>,
    pub password_secret_ref: Option<SecretRef>,
    pub aws_region_secret_ref: Option<SecretRef>,
    #[serde(rename = "awsAccessKeyIDSecretRef")]
    pub aws_access_key_id_secret_ref: Option<SecretRef>,
    pub aws_secret_access_key_secret_ref: Option<SecretRef>,
    #[serde(rename = "awsEndpointURLSecretRef")]
    pub aws_endpoint_url_secret_ref: Option<SecretRef>,
}

impl std::fmt::Debug for NessieConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |v: &Option<String>| v.as_ref().map(|_| "<hidden>");
        f.debug_struct("NessieConfig")
            .field("nessie_url", &self.nessie_url)
            .field("branch", &self.branch)
            .field("namespace", &self.namespace)
            .field("table", &self.table)
            .field("token", &hidden(&self.token))
            .field("user", &self.user)
            .field("password", &hidden(&self.password))
            .field("warehouse", &self.warehouse)
            .field("aws_region", &self.aws_region)
            .field("aws_access_key_id", &self.aws_access_key_id)
            .field("aws_secret_access_key", &hidden(&self.aws_secret_access_key))
            .field("aws_endpoint_url", &self.aws_endpoint_url)
            .finish_non_exhaustive()
    }
}

/// A name of a namespace level or a table: what Iceberg, Nessie and the
/// object store's keys all take as they are.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A Nessie branch name (Nessie allows more; these are the names that go
/// into a URL path as they are).
fn branch_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-./".contains(&b))
        && !name.split('/').any(|s| s.is_empty() || s == "." || s == "..")
}

impl NessieConfig {
    /// Field rules of a Nessie source (`role` Source) or sink at `path`.
    pub fn check(&self, role: Role, path: &str, errors: &mut ValidationErrors) {
        either(
            non_empty(&self.nessie_url),
            &self.nessie_url_secret_ref,
            path,
            "nessieUrl",
            errors,
        );
        either(
            non_empty(&self.namespace),
            &self.namespace_secret_ref,
            path,
            "namespace",
            errors,
        );
        either(non_empty(&self.table), &self.table_secret_ref, path, "table", errors);
        for (reference, field) in [
            (&self.branch_secret_ref, "branchSecretRef"),
            (&self.token_secret_ref, "tokenSecretRef"),
            (&self.password_secret_ref, "passwordSecretRef"),
            (&self.aws_region_secret_ref, "awsRegionSecretRef"),
            (&self.aws_access_key_id_secret_ref, "awsAccessKeyIDSecretRef"),
            (&self.aws_secret_access_key_secret_ref, "awsSecretAccessKeySecretRef"),
            (&self.aws_endpoint_url_secret_ref, "awsEndpointURLSecretRef"),
        ] {
            secret_ref(reference, path, field, errors);
        }
        if let Some(url) = self.nessie_url.as_deref().filter(|u| !u.is_empty()) {
            match http_endpoint(url) {
                Err(reason) => errors.push(FieldError::invalid(format!("{path}.nessieUrl"), reason)),
                Ok((_, _, false)) if self.sends_credentials() => errors.push(FieldError::invalid(
                    format!("{path}.nessieUrl"),
                    "a token or password is sent only over https://",
                )),
                Ok(_) => {}
            }
        }
        if let Some(url) = self.aws_endpoint_url.as_deref().filter(|u| !u.is_empty()) {
            let carries_credentials =
                reqwest::Url::parse(url).is_ok_and(|u| !u.username().is_empty() || u.password().is_some());
            match http_endpoint(url) {
                Err(reason) => errors.push(FieldError::invalid(format!("{path}.awsEndpointURL"), reason)),
                Ok(_) if carries_credentials => errors.push(FieldError::invalid(
                    format!("{path}.awsEndpointURL"),
                    "must not carry credentials: give awsAccessKeyID and awsSecretAccessKey",
                )),
                Ok(_) => {}
            }
        }
        if let Some(branch) = &self.branch
            && !branch_name(branch)
        {
            errors.push(FieldError::invalid(
                format!("{path}.branch"),
                "letters, digits, _ - . and / between non-empty parts",
            ));
        }
        if let Some(namespace) = &self.namespace
            && !namespace.split('.').all(plain_name)
        {
            errors.push(FieldError::invalid(
                format!("{path}.namespace"),
                "levels of letters, digits, _ and - (up to 128 each), separated by dots",
            ));
        }
        if let Some(table) = &self.table
            && !plain_name(table)
        {
            errors.push(FieldError::invalid(
                format!("{path}.table"),
                "letters, digits, _ and - (up to 128)",
            ));
        }
        if (self.token.is_some() || self.token_secret_ref.is_some())
            && (self.password.is_some() || self.password_secret_ref.is_some())
        {
            errors.push(FieldError::invalid(
                format!("{path}.token"),
                "give a token or a password, not both",
            ));
        }
        if (self.password.is_some() || self.password_secret_ref.is_some()) && self.user.is_none() {
            errors.push(FieldError::required(format!("{path}.user")));
        }
        if self.aws_access_key_id.is_some() != self.aws_secret_access_key.is_some()
            && self.aws_access_key_id_secret_ref.is_none()
            && self.aws_secret_access_key_secret_ref.is_none()
        {
            errors.push(FieldError::invalid(
                format!("{path}.awsSecretAccessKey"),
                "awsAccessKeyID and awsSecretAccessKey go together",
            ));
        }
        if self.poll_interval == Some(0) {
            errors.push(FieldError::invalid(
                format!("{path}.pollInterval"),
                "must be at least 1 second",
            ));
        }
        if self.batch_size.is_some_and(|n| !(1..=MAX_BATCH).contains(&n)) {
            errors.push(FieldError::invalid(
                format!("{path}.batchSize"),
                format!("must be 1 to {MAX_BATCH}"),
            ));
        }
        let only = |given: bool, field: &str, role_of: Role, errors: &mut ValidationErrors| {
            if given && role != role_of {
                let what = if role_of == Role::Source { "source" } else { "sink" };
                errors.push(FieldError::invalid(
                    format!("{path}.{field}"),
                    format!("applies to a nessie {what} only"),
                ));
            }
        };
        only(self.poll_interval.is_some(), "pollInterval", Role::Source, errors);
        only(self.batch_size.is_some(), "batchSize", Role::Source, errors);
        only(
            self.auto_create_namespace.is_some(),
            "autoCreateNamespace",
            Role::Sink,
            errors,
        );
        only(self.auto_create_table.is_some(), "autoCreateTable", Role::Sink, errors);
        only(self.exactly_once.is_some(), "exactlyOnce", Role::Sink, errors);
    }

    fn sends_credentials(&self) -> bool {
        self.token.is_some()
            || self.token_secret_ref.is_some()
            || self.password.is_some()
            || self.password_secret_ref.is_some()
    }

    pub fn branch(&self) -> Result<&str, ConnectorError> {
        match (&self.branch, &self.branch_secret_ref) {
            (None, None) => Ok("main"),
            (branch, reference) => inline(branch.as_deref(), reference, "branch"),
        }
    }

    /// `branch/namespace.table`, as status and errors name the table.
    pub fn target(&self) -> Result<String, ConnectorError> {
        Ok(format!(
            "{}/{}.{}",
            self.branch()?,
            inline(self.namespace.as_deref(), &self.namespace_secret_ref, "namespace")?,
            inline(self.table.as_deref(), &self.table_secret_ref, "table")?
        ))
    }

    fn optional<'a>(
        value: &'a Option<String>,
        reference: &Option<SecretRef>,
        field: &str,
    ) -> Result<Option<&'a str>, ConnectorError> {
        match (value, reference) {
            (None, None) => Ok(None),
            (value, reference) => inline(value.as_deref(), reference, field).map(Some),
        }
    }

    fn s3_settings(&self) -> Result<S3Settings, ConnectorError> {
        let owned = |v: Option<&str>| v.map(str::to_owned);
        Ok(S3Settings {
            endpoint: owned(Self::optional(
                &self.aws_endpoint_url,
                &self.aws_endpoint_url_secret_ref,
                "awsEndpointURL",
            )?),
            region: owned(Self::optional(
                &self.aws_region,
                &self.aws_region_secret_ref,
                "awsRegion",
            )?),
            access_key: owned(Self::optional(
                &self.aws_access_key_id,
                &self.aws_access_key_id_secret_ref,
                "awsAccessKeyID",
            )?),
            secret_key: owned(Self::optional(
                &self.aws_secret_access_key,
                &self.aws_secret_access_key_secret_ref,
                "awsSecretAccessKey",
            )?),
        })
    }
}

/// Most rows a source hands out at once: each is held as a message.
pub const MAX_BATCH: u32 = 10_000;

/// Longest one request to the catalog may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The Iceberg REST catalog URI of `branch` on the server `url` names.
pub fn catalog_uri(url: &str, branch: &str) -> Result<String, ConnectorError> {
    let mut parsed = reqwest::Url::parse(url).map_err(|_| ConnectorError::Config("nessieUrl is not a URL".into()))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(ConnectorError::Config(
            "nessieUrl must not carry credentials: give user and password, or token".into(),
        ));
    }
    parsed.set_query(None);
    parsed.set_fragment(None);
    let mut base = parsed.path().trim_end_matches('/').to_owned();
    for api in ["/api/v2", "/api/v1", "/api", "/iceberg"] {
        if let Some(rest) = base.strip_suffix(api) {
            base = rest.to_owned();
            break;
        }
    }
    parsed.set_path(&format!("{base}/iceberg/{branch}"));
    Ok(parsed.to_string())
}

/// A table of a Nessie branch.
pub struct Nessie {
    pub catalog: RestCatalog,
    pub namespace: NamespaceIdent,
    pub ident: TableIdent,
    /// `branch/namespace.table`.
    pub target: String,
}

impl Nessie {
    pub async fn connect(config: &NessieConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let url = inline(config.nessie_url.as_deref(), &config.nessie_url_secret_ref, "nessieUrl")?;
        let (_, _, https) = http_endpoint(url).map_err(|e| ConnectorError::Config(format!("nessieUrl {e}")))?;
        let branch = config.branch()?;
        if !branch_name(branch) {
            return Err(ConnectorError::Config(format!(
                "branch {branch:?} is not a branch name sless takes"
            )));
        }
        let namespace = inline(config.namespace.as_deref(), &config.namespace_secret_ref, "namespace")?;
        let table = inline(config.table.as_deref(), &config.table_secret_ref, "table")?;
        if !namespace.split('.').all(plain_name) || !plain_name(table) {
            return Err(ConnectorError::Config(format!(
                "{namespace}.{table}: names of letters, digits, _ and - only"
            )));
        }
        let uri = catalog_uri(url, branch)?;
        let mut props = HashMap::from([("uri".to_owned(), uri.clone())]);
        if let Some(warehouse) = &config.warehouse {
            props.insert("warehouse".into(), warehouse.clone());
        }
        let token = NessieConfig::optional(&config.token, &config.token_secret_ref, "token")?;
        let password = NessieConfig::optional(&config.password, &config.password_secret_ref, "password")?;
        if (token.is_some() || password.is_some()) && !https {
            return Err(ConnectorError::Config(
                "a token or password is sent only over https://".into(),
            ));
        }
        if let Some(token) = token {
            props.insert("token".into(), token.to_owned());
        }
        if let Some(password) = password {
            use base64::Engine as _;
            let user = config.user.as_deref().unwrap_or_default();
            let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            props.insert("header.Authorization".into(), format!("Basic {basic}"));
        }
        let tls = match &config.tls {
            Some(tls) => tls.http(&ctx.egress)?,
            None => Default::default(),
        };
        let http = ctx
            .egress
            .http_client_with(&uri, REQUEST_TIMEOUT, tls)
            .await
            .map_err(|e| match e {
                ConnectorError::Config(m) => ConnectorError::Config(format!("nessieUrl {m}")),
                other => other,
            })?;
        let factory = S3StoreFactory::new(config.s3_settings()?, ctx.egress.clone());
        let catalog = RestCatalogBuilder::default()
            .with_client(http)
            .with_storage_factory(Arc::new(factory))
            .load("nessie", props)
            .await
            .map_err(|e| catalog_error(&e, "nessieUrl"))?;
        let namespace = NamespaceIdent::from_vec(namespace.split('.').map(str::to_owned).collect())
            .map_err(|e| ConnectorError::Config(format!("namespace: {}", e.message())))?;
        let ident = TableIdent::new(namespace.clone(), table.to_owned());
        Ok(Self {
            catalog,
            namespace,
            ident,
            target: config.target()?,
        })
    }

    /// The table as the catalog has it now.
    pub async fn load(&self) -> Result<Table, ConnectorError> {
        self.catalog
            .load_table(&self.ident)
            .await
            .map_err(|e| catalog_error(&e, &self.target))
    }
}

/// The HTTP status of a catalog's answer that `e` reports, if any:
/// Iceberg's REST client puts it first among an error's context (and the
/// answer's body after it, which is why the text is read no further).
fn status_of(e: &iceberg::Error) -> Option<u16> {
    let text = e.to_string();
    let (_, rest) = text.split_once(", context: { status: ")?;
    rest.get(..3)?.parse().ok()
}

/// A failure of the catalog or the store about `what`, as a connector's
/// error: a missing namespace or table, a refused login and a refused
/// request are the spec's to fix; anything else may be retried. Only the
/// kind, the status and Iceberg's own message are told: never the
/// answer's body, which a server of any kind could have sent.
pub fn catalog_error(e: &iceberg::Error, what: &str) -> ConnectorError {
    let message: String = e.message().chars().take(300).collect();
    let status = status_of(e);
    let answered = status.map(|s| format!(" (HTTP {s})")).unwrap_or_default();
    match (e.kind(), status) {
        (ErrorKind::TableNotFound, _) => ConnectorError::Config(format!("{what}: no such table")),
        (ErrorKind::NamespaceNotFound, _) => ConnectorError::Config(format!("{what}: no such namespace")),
        (ErrorKind::FeatureUnsupported | ErrorKind::DataInvalid, _) => {
            ConnectorError::Config(format!("{what}: {message}"))
        }
        (ErrorKind::CatalogCommitConflicts, _) => {
            ConnectorError::Transient(format!("{what}: another writer committed first"))
        }
        (_, Some(401 | 403)) => ConnectorError::Config(format!("{what}: the catalog refused the login{answered}")),
        (_, Some(400 | 404)) => ConnectorError::Config(format!(
            "{what}: the catalog refused the request{answered} (is there such a branch?)"
        )),
        _ => ConnectorError::Transient(format!("{what}: {message}{answered}")),
    }
}

/// Where an exactly-once sink keeps its dataflow's position: a table
/// property of its own per dataflow, set in the same commit as the batch's
/// data files. (Nessie's catalog keeps only a table's current snapshot in
/// its metadata, its history being Nessie's commits; properties go on from
/// commit to commit, whoever makes it.)
#[derive(Debug)]
pub struct PositionProperty {
    /// `sless.position.{digest of the dataflow key}`.
    pub name: String,
    /// `{dataflow} {branch/namespace.table}`.
    key: String,
}

/// A stored position as its property holds it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Stored {
    dataflow: String,
    position: String,
    seal: String,
}

impl PositionProperty {
    pub fn of(ctx: &PipelineContext, target: &str) -> Self {
        use sha2::Digest;
        let key = format!("{} {target}", ctx.id);
        let digest = sha2::Sha256::digest(key.as_bytes());
        Self {
            name: format!("sless.position.{}", sless_runtime::hex::encode(&digest[..8])),
            key,
        }
    }

    /// The property's value for `position`, sealed with `seal_key`.
    pub fn value(&self, position: &str, seal_key: &crate::context::PositionsKey) -> String {
        serde_json::json!({
            "dataflow": self.key,
            "position": position,
            "seal": seal_key.seal(&self.key, position),
        })
        .to_string()
    }

    /// The position `table` holds for this dataflow, unchecked.
    pub fn read(&self, table: &Table) -> Option<String> {
        self.stored(table).map(|s| s.position)
    }

    /// The position `table` holds for this dataflow, if its seal is
    /// `seal_key`'s; one sealed otherwise is refused, never resumed from.
    pub fn verified(
        &self,
        table: &Table,
        seal_key: &crate::context::PositionsKey,
    ) -> Result<Option<String>, ConnectorError> {
        match self.stored(table) {
            None => Ok(None),
            Some(s) if seal_key.verify(&self.key, &s.position, &s.seal) => Ok(Some(s.position)),
            Some(_) => Err(ConnectorError::Config(format!(
                "the position stored in table property {} is not sealed with this tenant's key; \
                 it was written or changed by someone else and is not resumed from",
                self.name
            ))),
        }
    }

    fn stored(&self, table: &Table) -> Option<Stored> {
        let text = table.metadata().properties().get(&self.name)?;
        serde_json::from_str::<Stored>(text)
            .ok()
            .filter(|s| s.dataflow == self.key)
            .or(Some(Stored {
                dataflow: self.key.clone(),
                position: String::new(),
                seal: String::new(),
            }))
    }
}

/// What [`Guarded`] answers a commit whose position is in the table already.
const ALREADY_COMMITTED: &str = "sless: the position is committed already";

/// The catalog as a sink's commit sees it: a commit another writer beat is
/// not made again by Iceberg (which would rebase it on the new snapshot
/// without looking at the position), and the table a commit is based on,
/// loaded just before it is sent, is checked for the position first: a
/// commit whose answer was lost and that landed meanwhile is found there.
#[derive(Debug)]
pub struct Guarded<'a> {
    pub catalog: &'a RestCatalog,
    /// This dataflow's property and the position the commit stores.
    pub position: Option<(&'a PositionProperty, &'a str)>,
}

impl Guarded<'_> {
    /// Whether `e` says the commit was made already.
    pub fn committed_already(e: &iceberg::Error) -> bool {
        e.kind() == ErrorKind::PreconditionFailed && e.message() == ALREADY_COMMITTED
    }
}

#[async_trait]
impl Catalog for Guarded<'_> {
    async fn list_namespaces(&self, parent: Option<&NamespaceIdent>) -> iceberg::Result<Vec<NamespaceIdent>> {
        self.catalog.list_namespaces(parent).await
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<Namespace> {
        self.catalog.create_namespace(namespace, properties).await
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<Namespace> {
        self.catalog.get_namespace(namespace).await
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> iceberg::Result<bool> {
        self.catalog.namespace_exists(namespace).await
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> iceberg::Result<()> {
        self.catalog.update_namespace(namespace, properties).await
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> iceberg::Result<()> {
        self.catalog.drop_namespace(namespace).await
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> iceberg::Result<Vec<TableIdent>> {
        self.catalog.list_tables(namespace).await
    }

    async fn create_table(&self, namespace: &NamespaceIdent, creation: TableCreation) -> iceberg::Result<Table> {
        self.catalog.create_table(namespace, creation).await
    }

    async fn load_table(&self, table: &TableIdent) -> iceberg::Result<Table> {
        let loaded = self.catalog.load_table(table).await?;
        if let Some((property, position)) = self.position
            && property.read(&loaded).as_deref() == Some(position)
        {
            return Err(iceberg::Error::new(ErrorKind::PreconditionFailed, ALREADY_COMMITTED));
        }
        Ok(loaded)
    }

    async fn drop_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        self.catalog.drop_table(table).await
    }

    async fn purge_table(&self, table: &TableIdent) -> iceberg::Result<()> {
        self.catalog.purge_table(table).await
    }

    async fn table_exists(&self, table: &TableIdent) -> iceberg::Result<bool> {
        self.catalog.table_exists(table).await
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> iceberg::Result<()> {
        self.catalog.rename_table(src, dest).await
    }

    async fn register_table(&self, table: &TableIdent, metadata_location: String) -> iceberg::Result<Table> {
        self.catalog.register_table(table, metadata_location).await
    }

    async fn update_table(&self, commit: TableCommit) -> iceberg::Result<Table> {
        self.catalog.update_table(commit).await.map_err(|e| {
            if e.kind() == ErrorKind::CatalogCommitConflicts {
                e.with_retryable(false)
            } else {
                e
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use sless_model::ValidationErrors;
    use sless_model::dataflow::Role;

    use super::{NessieConfig, catalog_uri};

    /// What a tenant may put in a spec: every hostile value is refused at
    /// its own field before anything connects.
    #[test]
    fn hostile_values_are_refused_at_their_fields() {
        let long = "t".repeat(10_000);
        for (config, field) in [
            (json!({"nessieUrl": "file:///etc/passwd"}), "nessieUrl"),
            (json!({"nessieUrl": "http://n:19120", "token": "secret"}), "nessieUrl"),
            (json!({"namespace": "a/../b"}), "namespace"),
            (json!({"namespace": "a..b"}), "namespace"),
            (json!({"table": "t; DROP TABLE x"}), "table"),
            (json!({"table": long}), "table"),
            (json!({"branch": "../main"}), "branch"),
            (json!({"branch": "main?x=1"}), "branch"),
            (json!({"awsEndpointURL": "http://key:secret@s3:9000"}), "awsEndpointURL"),
            (json!({"batchSize": 0}), "batchSize"),
            (json!({"batchSize": 1_000_000_000}), "batchSize"),
            (json!({"autoCreateTable": true}), "autoCreateTable"),
        ] {
            let mut spec = json!({"nessieUrl": "https://n:19120", "namespace": "n", "table": "t"});
            spec.as_object_mut()
                .unwrap()
                .extend(config.as_object().unwrap().clone());
            let config: NessieConfig = serde_json::from_value(spec.clone()).unwrap();
            let mut errors = ValidationErrors::default();
            config.check(Role::Source, "source.config", &mut errors);
            assert!(
                errors.0.iter().any(|e| e.field == format!("source.config.{field}")),
                "{spec}: {errors:?}"
            );
        }
        assert!(serde_json::from_value::<NessieConfig>(json!({"nessieUrl": "x", "unknown": 1})).is_err());
    }

    #[test]
    fn the_catalog_uri_is_the_branchs_under_the_servers_root() {
        for url in [
            "http://n:19120",
            "http://n:19120/",
            "http://n:19120/api/v2",
            "http://n:19120/iceberg?x=1#y",
        ] {
            assert_eq!(catalog_uri(url, "dev").unwrap(), "http://n:19120/iceberg/dev", "{url}");
        }
        assert!(
            catalog_uri("http://u:p@n:19120", "main").is_err(),
            "credentials in the URL"
        );
    }
}
