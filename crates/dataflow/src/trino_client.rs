//! What the Trino source and sink share: their config (upstream's
//! `TrinoSourceSpec` and `TrinoSinkSpec` in one, as Kafka's), and a client of
//! Trino's client protocol (`POST /v1/statement`, then `GET nextUri` until
//! there is none; `DELETE nextUri` cancels) that connects only where the
//! egress policy permits, with basic or bearer authentication over HTTPS.
//! Tested against Trino 476.
//!
//! A sink's rows reach Trino in one JSON literal cast to rows of the
//! columns' types ([`rows_select`]); Trino's answers come as JSON, `json`
//! columns parsed, decimals kept as exact strings.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use sless_model::dataflow::{Role, SecretRef};
use sless_model::{FieldError, ValidationErrors};

use crate::ConnectorError;
use crate::budget::{Allowance, Held};
use crate::component::{either, inline, non_empty, secret_ref};
use crate::egress::{CONNECT_WINDOW, EgressPolicy, connecting, http_endpoint, read_answer, read_answer_held};
use crate::tls::TlsConfig;

/// `config` of a `trino` source or sink. Its `Debug` leaves out the
/// password and the token.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrinoConfig {
    /// `http[s]://host:port` of the coordinator.
    #[serde(rename = "serverURL")]
    pub server_url: Option<String>,
    pub catalog: Option<String>,
    pub schema: Option<String>,
    /// A table of the catalog and schema (or `schema.table`, or
    /// `catalog.schema.table`).
    pub table: Option<String>,
    /// Source: a SELECT to read instead of `table`.
    pub query: Option<String>,
    /// The user queries run as (`X-Trino-User`). Default `sless`.
    pub user: Option<String>,
    /// Basic authentication of `user` (HTTPS only).
    pub password: Option<String>,
    /// Bearer authentication: a JWT or OAuth2 token (HTTPS only).
    pub token: Option<String>,
    pub tls: Option<TlsConfig>,
    /// Upstream's Keycloak login, refused with the way to do without it.
    pub keycloak: Option<Value>,
    /// Source: seconds between polls. Default 5.
    pub poll_interval: Option<u32>,
    /// Source: rows read per poll (default 1000); sink: rows per statement
    /// at most (default: the whole batch, split to fit a statement).
    pub batch_size: Option<u32>,
    /// Source: the column whose increasing values mark the read position.
    /// Default `id`.
    pub incremental_column: Option<String>,
    /// Source: a unique column that orders rows sharing an
    /// `incrementalColumn` value. Default `id`.
    pub id_column: Option<String>,
    /// Sink: creates the table (`data varchar`) when it does not exist.
    pub auto_create_table: Option<bool>,
    /// Sink: `MERGE` by `conflictKey` instead of `INSERT`.
    pub upsert_mode: Option<bool>,
    /// Sink: the key column(s) of `upsertMode`, comma-separated.
    pub conflict_key: Option<String>,
    #[serde(rename = "serverURLSecretRef")]
    pub server_url_secret_ref: Option<SecretRef>,
    pub catalog_secret_ref: Option<SecretRef>,
    pub schema_secret_ref: Option<SecretRef>,
    pub table_secret_ref: Option<SecretRef>,
    pub user_secret_ref: Option<SecretRef>,
    pub password_secret_ref: Option<SecretRef>,
    pub token_secret_ref: Option<SecretRef>,
}

impl std::fmt::Debug for TrinoConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |v: &Option<String>| v.as_ref().map(|_| "<hidden>");
        f.debug_struct("TrinoConfig")
            .field("server_url", &self.server_url)
            .field("catalog", &self.catalog)
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("query", &self.query)
            .field("user", &self.user)
            .field("password", &hidden(&self.password))
            .field("token", &hidden(&self.token))
            .field("tls", &self.tls)
            .field("keycloak", &self.keycloak.as_ref().map(|_| "<hidden>"))
            .field("poll_interval", &self.poll_interval)
            .field("batch_size", &self.batch_size)
            .field("incremental_column", &self.incremental_column)
            .field("id_column", &self.id_column)
            .field("auto_create_table", &self.auto_create_table)
            .field("upsert_mode", &self.upsert_mode)
            .field("conflict_key", &self.conflict_key)
            .finish_non_exhaustive()
    }
}

impl TrinoConfig {
    /// Field rules of a Trino source (`role` Source) or sink at `path`.
    pub fn check(&self, role: Role, path: &str, errors: &mut ValidationErrors) {
        either(
            non_empty(&self.server_url),
            &self.server_url_secret_ref,
            path,
            "serverURL",
            errors,
        );
        either(
            non_empty(&self.catalog),
            &self.catalog_secret_ref,
            path,
            "catalog",
            errors,
        );
        either(non_empty(&self.schema), &self.schema_secret_ref, path, "schema", errors);
        if role == Role::Sink || self.query.is_none() {
            either(non_empty(&self.table), &self.table_secret_ref, path, "table", errors);
        }
        for (reference, field) in [
            (&self.user_secret_ref, "userSecretRef"),
            (&self.password_secret_ref, "passwordSecretRef"),
            (&self.token_secret_ref, "tokenSecretRef"),
        ] {
            secret_ref(reference, path, field, errors);
        }
        if let Some(url) = self.server_url.as_deref().filter(|u| !u.is_empty()) {
            match http_endpoint(url) {
                Err(reason) => errors.push(FieldError::invalid(format!("{path}.serverURL"), reason)),
                Ok((_, _, false)) if self.sends_credentials() => errors.push(FieldError::invalid(
                    format!("{path}.serverURL"),
                    "a password or token is sent only over https://",
                )),
                Ok(_) => {}
            }
        }
        if self.keycloak.is_some() {
            errors.push(FieldError::invalid(
                format!("{path}.keycloak"),
                "sless does not log in to Keycloak itself: give the token it issues as token (or tokenSecretRef)",
            ));
        }
        if (self.password.is_some() || self.password_secret_ref.is_some())
            && (self.token.is_some() || self.token_secret_ref.is_some())
        {
            errors.push(FieldError::invalid(
                format!("{path}.token"),
                "give a password or a token, not both",
            ));
        }
        if self.poll_interval == Some(0) {
            errors.push(FieldError::invalid(
                format!("{path}.pollInterval"),
                "must be at least 1 second",
            ));
        }
        if self.batch_size == Some(0) {
            errors.push(FieldError::invalid(format!("{path}.batchSize"), "must be at least 1"));
        }
        let only = |given: bool, field: &str, role_of: Role, errors: &mut ValidationErrors| {
            if given && role != role_of {
                let what = if role_of == Role::Source { "source" } else { "sink" };
                errors.push(FieldError::invalid(
                    format!("{path}.{field}"),
                    format!("applies to a trino {what} only"),
                ));
            }
        };
        only(self.query.is_some(), "query", Role::Source, errors);
        only(self.poll_interval.is_some(), "pollInterval", Role::Source, errors);
        only(
            self.incremental_column.is_some(),
            "incrementalColumn",
            Role::Source,
            errors,
        );
        only(self.id_column.is_some(), "idColumn", Role::Source, errors);
        only(self.auto_create_table.is_some(), "autoCreateTable", Role::Sink, errors);
        only(self.upsert_mode.is_some(), "upsertMode", Role::Sink, errors);
        only(self.conflict_key.is_some(), "conflictKey", Role::Sink, errors);
        if self.upsert_mode == Some(true) && self.conflict_key.is_none() {
            errors.push(FieldError::required(format!("{path}.conflictKey")));
        }
    }

    fn sends_credentials(&self) -> bool {
        self.password.is_some()
            || self.password_secret_ref.is_some()
            || self.token.is_some()
            || self.token_secret_ref.is_some()
    }

    /// The table as the spec names it.
    pub fn table_name(&self) -> Result<&str, ConnectorError> {
        inline(self.table.as_deref(), &self.table_secret_ref, "table")
    }
}

/// Longest a statement may run (all its pages) before it is cancelled and
/// retried.
const QUERY_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest one request of the protocol may take: Trino answers a `nextUri`
/// within about a second, with or without rows.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes of one statement's answers together: a source's batch.
const MAX_ANSWER_BYTES: usize = 64 << 20;
/// Most of an answer to the connect probe read.
const PROBE_ANSWER_BYTES: usize = 64 << 10;
/// Pause before a request Trino answered 502, 503 or 504 is sent again, as
/// its protocol asks.
const BUSY_PAUSE: Duration = Duration::from_millis(100);
/// Most of the answers read to a statement that returns no rows of data
/// (DDL, INSERT, MERGE, a `LIMIT 0` for the columns).
const STATEMENT_ANSWER_BYTES: usize = 1 << 20;
/// Most rows such a statement may answer (an INSERT's count).
const STATEMENT_ROWS: usize = 16;
/// Most columns, and the longest column name, an answer may have: what
/// any table has, far short of what would take the process's memory.
const MAX_COLUMNS: usize = 1600;
const MAX_COLUMN_NAME: usize = 1024;
/// Longest statement sent: Trino refuses those over `query.max-length`
/// (1,000,000 characters by default).
pub const MAX_STATEMENT_BYTES: usize = 512 << 10;

/// Trino error names that mean the rows, not the server or the spec, are at
/// fault. Each with what it means, the only words of an error passed on.
const DATA_ERRORS: &[(&str, &str)] = &[
    ("INVALID_CAST_ARGUMENT", "a value does not convert to its column's type"),
    ("INVALID_FUNCTION_ARGUMENT", "a value is not valid for its column"),
    ("NUMERIC_VALUE_OUT_OF_RANGE", "a number is out of its column's range"),
    ("INVALID_LITERAL", "a value is not a valid literal of its type"),
    ("CONSTRAINT_VIOLATION", "a row breaks a constraint of the table"),
    ("INVALID_ARGUMENTS", "a value is not valid for its column"),
    (
        "MERGE_TARGET_ROW_MULTIPLE_MATCHES",
        "two rows of one batch have the same key",
    ),
];

/// Names that mean the spec names something wrong: no retry can help.
const CONFIG_ERRORS: &[(&str, &str)] = &[
    ("TABLE_NOT_FOUND", "no such table"),
    ("COLUMN_NOT_FOUND", "no such column"),
    ("SCHEMA_NOT_FOUND", "no such schema"),
    ("CATALOG_NOT_FOUND", "no such catalog"),
    ("MISSING_CATALOG_NAME", "no catalog given"),
    ("MISSING_SCHEMA_NAME", "no schema given"),
    ("SYNTAX_ERROR", "the statement does not parse"),
    ("TYPE_MISMATCH", "a value's type does not fit its column"),
    ("PERMISSION_DENIED", "the user may not do this"),
    ("NOT_SUPPORTED", "the catalog does not support this statement"),
    ("MISSING_COLUMN_NAME", "a column of the query has no name"),
    ("AMBIGUOUS_NAME", "a column name is ambiguous"),
    ("INVALID_COLUMN_REFERENCE", "a column is referenced where it may not be"),
    ("QUERY_TEXT_TOO_LARGE", "the statement is longer than the server takes"),
];

/// A column of an answer: its name and its Trino type, as the server
/// writes them (`bigint`, `decimal(20, 4)`, `timestamp(3) with time zone`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub ty: String,
}

/// What a statement answered.
#[derive(Debug, Default)]
pub struct Answer {
    pub columns: Vec<Column>,
    pub rows: Vec<Vec<Value>>,
}

impl Answer {
    /// The rows as JSON objects by column name, `json` values parsed.
    pub fn objects(self) -> Vec<serde_json::Map<String, Value>> {
        let columns = self.columns;
        self.rows
            .into_iter()
            .map(|row| {
                columns
                    .iter()
                    .zip(row)
                    .map(|(column, value)| (column.name.clone(), from_trino(&column.ty, value)))
                    .collect()
            })
            .collect()
    }
}

/// A value as Trino answered it, as a message carries it: a `json`
/// column's text parsed; everything else as it came (decimals as exact
/// strings, varbinary as base64, rows as arrays).
fn from_trino(ty: &str, value: Value) -> Value {
    match value {
        Value::String(text) if ty == "json" => serde_json::from_str(&text).unwrap_or(Value::String(text)),
        other => other,
    }
}

/// How a request is authenticated.
enum Auth {
    None,
    Basic(String),
    Bearer(String),
}

/// A Trino coordinator, a catalog and a schema, reached over HTTP(S).
pub struct Trino {
    http: reqwest::Client,
    /// `scheme://host:port/v1/statement`.
    statement: reqwest::Url,
    user: String,
    auth: Auth,
    catalog: String,
    schema: String,
}

/// One page of the protocol (`QueryResults`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page {
    next_uri: Option<String>,
    columns: Option<Vec<PageColumn>>,
    /// Parsed apart, within the statement's bounds ([`rows_within`]).
    data: Option<Box<serde_json::value::RawValue>>,
    error: Option<PageError>,
}

#[derive(Deserialize)]
struct PageColumn {
    name: String,
    #[serde(rename = "type")]
    ty: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PageError {
    #[serde(default)]
    error_name: String,
    #[serde(default)]
    error_type: String,
    /// The server's words: logged for the operator, never passed on.
    #[serde(default)]
    message: String,
}

impl Trino {
    /// Connects and checks that Trino answers as Trino, with the login.
    pub async fn connect(config: &TrinoConfig, egress: &EgressPolicy) -> Result<Self, ConnectorError> {
        let url = inline(config.server_url.as_deref(), &config.server_url_secret_ref, "serverURL")?;
        let (_, _, https) = http_endpoint(url).map_err(|e| ConnectorError::Config(format!("serverURL {e}")))?;
        let mut statement =
            reqwest::Url::parse(url).map_err(|_| ConnectorError::Config("serverURL is not a URL".into()))?;
        if !statement.username().is_empty() || statement.password().is_some() {
            return Err(ConnectorError::Config(
                "serverURL must not carry credentials: give user and password".into(),
            ));
        }
        statement.set_path("/v1/statement");
        statement.set_query(None);
        statement.set_fragment(None);
        let user = match (&config.user, &config.user_secret_ref) {
            (None, None) => "sless".to_owned(),
            (user, reference) => inline(user.as_deref(), reference, "user")?.to_owned(),
        };
        let password = config.password.is_some() || config.password_secret_ref.is_some();
        let token = config.token.is_some() || config.token_secret_ref.is_some();
        let auth = match (password, token) {
            (true, _) => {
                Auth::Basic(inline(config.password.as_deref(), &config.password_secret_ref, "password")?.to_owned())
            }
            (false, true) => {
                Auth::Bearer(inline(config.token.as_deref(), &config.token_secret_ref, "token")?.to_owned())
            }
            (false, false) => Auth::None,
        };
        if !https && !matches!(auth, Auth::None) {
            return Err(ConnectorError::Config(
                "a password or token is sent only over https://".into(),
            ));
        }
        let tls = match &config.tls {
            Some(tls) => tls.http(egress)?,
            None => Default::default(),
        };
        let http = egress
            .http_client_with(url, REQUEST_TIMEOUT, tls)
            .await
            .map_err(|e| match e {
                ConnectorError::Config(m) => ConnectorError::Config(format!("serverURL {m}")),
                other => other,
            })?;
        let client = Self {
            http,
            statement,
            user,
            auth,
            catalog: inline(config.catalog.as_deref(), &config.catalog_secret_ref, "catalog")?.to_owned(),
            schema: inline(config.schema.as_deref(), &config.schema_secret_ref, "schema")?.to_owned(),
        };
        // Within the connect window, whatever the endpoint does.
        connecting(CONNECT_WINDOW, client.probe(), unreachable).await?;
        Ok(client)
    }

    /// `SELECT 1`, which only Trino answers as Trino does: `[[1]]`. A
    /// refused login says so; any other answer is as if none came.
    async fn probe(&self) -> Result<(), ConnectorError> {
        match self.run_with("SELECT 1", None, PROBE_ANSWER_BYTES, 1).await {
            Ok((answer, _)) if answer.rows == [[Value::from(1)]] => Ok(()),
            Err(e @ ConnectorError::Config(_)) => Err(e),
            _ => Err(unreachable()),
        }
    }

    /// Runs `sql`, a statement that answers at most a few rows (DDL, an
    /// INSERT, a `LIMIT 0`), all its pages, and returns what it answered.
    pub async fn run(&self, sql: &str) -> Result<Answer, ConnectorError> {
        self.run_with(sql, None, STATEMENT_ANSWER_BYTES, STATEMENT_ROWS)
            .await
            .map(|(answer, _)| answer)
    }

    /// Runs `sql`, a query of at most `max_rows` rows. Its answer is held of
    /// `memory` until the [`Held`]s drop (while the rows are read and turned
    /// into messages): its bytes, and what the rows take as objects.
    pub async fn run_held(
        &self,
        sql: &str,
        memory: &Allowance,
        max_rows: usize,
    ) -> Result<(Answer, Vec<Held>), ConnectorError> {
        let (answer, mut held) = self.run_with(sql, Some(memory), MAX_ANSWER_BYTES, max_rows).await?;
        // Each object repeats the column names, beside its values' bytes.
        let per_row: usize = answer.columns.iter().map(|c| c.name.len() + 64).sum();
        held.push(memory.hold((answer.rows.len() * per_row) as u64)?);
        Ok((answer, held))
    }

    /// Runs `sql` with at most `cap` bytes of answers, all pages together,
    /// and at most `max_rows` rows.
    async fn run_with(
        &self,
        sql: &str,
        memory: Option<&Allowance>,
        cap: usize,
        max_rows: usize,
    ) -> Result<(Answer, Vec<Held>), ConnectorError> {
        let run = async {
            let response = self.send_retrying(|| self.post(sql)).await?;
            let (page, mut used, held) = self.page(response, memory, cap).await?;
            let mut answer = Answer::default();
            let mut all_held: Vec<Held> = held.into_iter().collect();
            let mut cancel = Cancel::new(self);
            let mut page = Some(page);
            while let Some(current) = page.take() {
                if let Some(error) = &current.error {
                    cancel.done();
                    return Err(classify(error));
                }
                if let Some(columns) = current.columns {
                    answer.columns = columns_within(columns)?;
                }
                if let Some(data) = current.data {
                    let width = if answer.columns.is_empty() {
                        MAX_COLUMNS
                    } else {
                        answer.columns.len()
                    };
                    let room = max_rows.saturating_sub(answer.rows.len());
                    answer.rows.extend(rows_within(&data, room, width)?);
                }
                let Some(next) = current.next_uri else {
                    cancel.done();
                    break;
                };
                let next = self.same_origin(&next)?;
                cancel.next = Some(next.clone());
                let response = self
                    .send_retrying(|| self.authorized(self.http.get(next.clone())))
                    .await?;
                let (following, bytes, held) = self.page(response, memory, cap.saturating_sub(used)).await?;
                used += bytes;
                all_held.extend(held);
                page = Some(following);
            }
            Ok((answer, all_held))
        };
        tokio::time::timeout(QUERY_TIMEOUT, run)
            .await
            .map_err(|_| ConnectorError::Transient(format!("the Trino statement took longer than {QUERY_TIMEOUT:?}")))?
    }

    /// A page of an answer read within `cap` bytes, with its length, its
    /// bytes held of `memory` if given.
    async fn page(
        &self,
        response: reqwest::Response,
        memory: Option<&Allowance>,
        cap: usize,
    ) -> Result<(Page, usize, Option<Held>), ConnectorError> {
        // The protocol has no redirect: what sends one is not Trino.
        if response.status().is_redirection() {
            return Err(unreachable());
        }
        let (answer, held) = match memory {
            Some(memory) => {
                let (answer, held) = read_answer_held(response, cap, "Trino", memory).await?;
                (answer, Some(held))
            }
            None => (read_answer(response, cap, "Trino").await?, None),
        };
        let status = answer.status.as_u16();
        if matches!(status, 401 | 403) {
            return Err(refused_login(status));
        }
        if !answer.status.is_success() {
            return Err(ConnectorError::Transient(format!("Trino answered HTTP {status}")));
        }
        let page = serde_json::from_slice(&answer.body)
            .map_err(|_| ConnectorError::Transient("Trino's answer is not the client protocol's JSON".into()))?;
        Ok((page, answer.body.len(), held))
    }

    /// `next` as a URL, if it names the server the spec names: the client
    /// reaches only the addresses the egress policy checked for that host.
    fn same_origin(&self, next: &str) -> Result<reqwest::Url, ConnectorError> {
        let url = reqwest::Url::parse(next)
            .map_err(|_| ConnectorError::Transient("Trino sent a nextUri that is not a URL".into()))?;
        if url.origin() != self.statement.origin() {
            return Err(ConnectorError::Config(
                "Trino's nextUri names another server than serverURL (is it behind a proxy that rewrites the host?)"
                    .into(),
            ));
        }
        Ok(url)
    }

    fn post(&self, sql: &str) -> reqwest::RequestBuilder {
        self.authorized(
            self.http
                .post(self.statement.clone())
                .header("X-Trino-Catalog", &self.catalog)
                .header("X-Trino-Schema", &self.schema)
                .header("X-Trino-Source", "sless-dataflow")
                .header("X-Trino-Time-Zone", "UTC")
                .body(sql.to_owned()),
        )
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let request = request.header("X-Trino-User", &self.user);
        match &self.auth {
            Auth::None => request,
            Auth::Basic(password) => request.basic_auth(&self.user, Some(password)),
            Auth::Bearer(token) => request.bearer_auth(token),
        }
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, ConnectorError> {
        request.send().await.map_err(|e| {
            tracing::info!(error = %e.without_url(), "Trino request failed");
            unreachable()
        })
    }

    /// Sends what `request` builds until Trino is not busy (502, 503, 504).
    async fn send_retrying(
        &self,
        request: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ConnectorError> {
        loop {
            let response = self.send(request()).await?;
            if !matches!(response.status().as_u16(), 502..=504) {
                return Ok(response);
            }
            tokio::time::sleep(BUSY_PAUSE).await;
        }
    }
}

/// Cancels a statement whose answer is abandoned (an error, a timeout, a
/// stop): `DELETE` of its last `nextUri`, so Trino stops running it.
struct Cancel<'a> {
    trino: &'a Trino,
    next: Option<reqwest::Url>,
}

impl<'a> Cancel<'a> {
    fn new(trino: &'a Trino) -> Self {
        Self { trino, next: None }
    }

    /// The statement ended: nothing to cancel.
    fn done(&mut self) {
        self.next = None;
    }
}

impl Drop for Cancel<'_> {
    fn drop(&mut self) {
        let Some(next) = self.next.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let request = self.trino.authorized(self.trino.http.delete(next));
        runtime.spawn(async move {
            let _ = request.send().await;
        });
    }
}

/// The columns of an answer, if within [`MAX_COLUMNS`] and
/// [`MAX_COLUMN_NAME`].
fn columns_within(columns: Vec<PageColumn>) -> Result<Vec<Column>, ConnectorError> {
    if columns.len() > MAX_COLUMNS || columns.iter().any(|c| c.name.len() > MAX_COLUMN_NAME) {
        return Err(beyond_bounds());
    }
    Ok(columns.into_iter().map(|c| Column { name: c.name, ty: c.ty }).collect())
}

/// A page's rows, parsed only while there are at most `max_rows` of them,
/// each of at most `width` values: a server's answer of millions of empty
/// rows, or of one row of millions of values, stops at the bound instead
/// of taking the process's memory.
fn rows_within(
    data: &serde_json::value::RawValue,
    max_rows: usize,
    width: usize,
) -> Result<Vec<Vec<Value>>, ConnectorError> {
    use serde::de::{DeserializeSeed, Error as _, SeqAccess, Visitor};

    /// An array of at most `max` items: rows (each bounded by `width`), or
    /// the values of a row (`width` none).
    struct Bounded {
        max: usize,
        width: Option<usize>,
    }

    impl<'de> Visitor<'de> for Bounded {
        type Value = Vec<Value>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array within bounds")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Value>, A::Error> {
            let mut items = Vec::new();
            loop {
                let item = match self.width {
                    None => seq.next_element::<Value>()?,
                    Some(width) => seq
                        .next_element_seed(Bounded {
                            max: width,
                            width: None,
                        })?
                        .map(Value::Array),
                };
                let Some(item) = item else { return Ok(items) };
                if items.len() == self.max {
                    return Err(A::Error::custom("beyond bounds"));
                }
                items.push(item);
            }
        }
    }

    impl<'de> DeserializeSeed<'de> for Bounded {
        type Value = Vec<Value>;

        fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Vec<Value>, D::Error> {
            deserializer.deserialize_seq(self)
        }
    }

    let mut parser = serde_json::Deserializer::from_str(data.get());
    let rows = Bounded {
        max: max_rows,
        width: Some(width),
    }
    .deserialize(&mut parser)
    .map_err(|_| beyond_bounds())?;
    Ok(rows
        .into_iter()
        .map(|row| match row {
            Value::Array(values) => values,
            _ => Vec::new(),
        })
        .collect())
}

fn beyond_bounds() -> ConnectorError {
    ConnectorError::Transient("Trino answered more rows or columns than the statement asked for, or wider ones".into())
}

fn unreachable() -> ConnectorError {
    ConnectorError::Connect("the Trino server cannot be reached or did not answer as Trino".into())
}

fn refused_login(status: u16) -> ConnectorError {
    ConnectorError::Config(match status {
        401 => "Trino refused the login (HTTP 401): check user, password or token".into(),
        _ => "Trino refused the user (HTTP 403)".into(),
    })
}

/// The error a Trino error stands for. Its message is the server's and is
/// not passed on: the error names the error's name (a bounded identifier),
/// and what it means where it is known.
fn classify(error: &PageError) -> ConnectorError {
    let words: String = error.message.chars().take(500).collect();
    tracing::debug!(name = %error.error_name, message = %words, "Trino answered an error");
    let name: String = error
        .error_name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(64)
        .collect();
    let known = |table: &[(&str, &'static str)]| table.iter().find(|(n, _)| *n == name).map(|(_, m)| *m);
    if let Some(meaning) = known(DATA_ERRORS) {
        ConnectorError::Data(format!("Trino error {name}: {meaning}"))
    } else if let Some(meaning) = known(CONFIG_ERRORS) {
        ConnectorError::Config(format!("Trino error {name}: {meaning}"))
    } else if error.error_type == "USER_ERROR" {
        // Another fault of the statement: as the spec wrote it.
        ConnectorError::Config(format!("Trino error {name}"))
    } else {
        ConnectorError::Transient(format!("Trino error {name}"))
    }
}

/// A Trino string literal of `text`.
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A quoted Trino identifier.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `table`, `schema.table` or `catalog.schema.table`, each part
/// `[A-Za-z_][A-Za-z0-9_]*`, quoted.
pub fn quote_table(name: &str) -> Result<String, ConnectorError> {
    let parts: Vec<&str> = name.split('.').collect();
    let valid = |p: &str| {
        p.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if parts.len() > 3 || !parts.iter().all(|p| valid(p)) {
        return Err(ConnectorError::Config(format!(
            "{name:?} is not a table name ([A-Za-z_][A-Za-z0-9_]*, optionally schema.table or catalog.schema.table)"
        )));
    }
    Ok(parts.iter().map(|p| quote_ident(p)).collect::<Vec<_>>().join("."))
}

/// How a value of a column travels in a sink's statement: all rows ride in
/// one JSON literal cast to rows ([`rows_select`]), which Trino plans about
/// three times faster than a `VALUES` list of a cast per value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carry {
    /// As the JSON value itself, into a field of the column's type: `json`,
    /// arrays, maps, rows.
    Json,
    /// As text, into a field of the column's type (Trino casts a JSON string
    /// to it exactly: numbers, decimals, booleans, varchar).
    Text,
    /// As text into a varchar field, cast to the type in the select list
    /// (Trino casts no JSON to it: timestamps, dates, uuids, …).
    TextCast,
    /// As base64 text, decoded in the select list: varbinary.
    Base64,
}

fn carry(ty: &str) -> Carry {
    let base = ty.split('(').next().unwrap_or(ty).trim();
    match base {
        "json" | "array" | "map" | "row" => Carry::Json,
        "boolean" | "tinyint" | "smallint" | "integer" | "bigint" | "real" | "double" | "decimal" | "varchar" => {
            Carry::Text
        }
        "varbinary" => Carry::Base64,
        _ => Carry::TextCast,
    }
}

/// What the JSON literal carries for `value` in a column of type `ty`.
pub fn carried(ty: &str, value: Option<&Value>) -> Value {
    match (carry(ty), value) {
        (_, None | Some(Value::Null)) => Value::Null,
        (Carry::Json, Some(v)) => v.clone(),
        (_, Some(Value::String(text))) => Value::String(text.clone()),
        // Numbers as their text: Trino reads JSON numbers as doubles, which
        // would round a decimal's digits.
        (_, Some(other)) => Value::String(other.to_string()),
    }
}

/// `SELECT … FROM UNNEST(…)`: the rows of `rows` (a JSON array of arrays,
/// each of [`carried`] values in the order of `columns`) as a relation
/// with the columns' names and types.
pub fn rows_select(columns: &[&Column], rows: &str) -> String {
    let field = |i: usize| format!("f{i}");
    let fields = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let ty = match carry(&c.ty) {
                Carry::Json | Carry::Text => c.ty.as_str(),
                Carry::TextCast | Carry::Base64 => "varchar",
            };
            format!("{} {ty}", field(i))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let selected = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let value = match carry(&c.ty) {
                Carry::Json | Carry::Text => field(i),
                Carry::TextCast => format!("CAST({} AS {})", field(i), c.ty),
                Carry::Base64 => format!("from_base64({})", field(i)),
            };
            format!("{value} AS {}", quote_ident(&c.name))
        })
        .collect::<Vec<_>>()
        .join(", ");
    let names = (0..columns.len()).map(field).collect::<Vec<_>>().join(", ");
    format!(
        "SELECT {selected} FROM UNNEST(CAST(json_parse({}) AS array(row({fields})))) AS x({names})",
        literal(rows)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(name: &str, kind: &str) -> PageError {
        PageError {
            error_name: name.into(),
            error_type: kind.into(),
            message: String::new(),
        }
    }

    #[test]
    fn errors_are_classified_by_name_and_pass_on_only_the_name() {
        assert!(matches!(
            classify(&error("TABLE_NOT_FOUND", "USER_ERROR")),
            ConnectorError::Config(m) if m == "Trino error TABLE_NOT_FOUND: no such table"
        ));
        assert!(matches!(
            classify(&error("INVALID_CAST_ARGUMENT", "USER_ERROR")),
            ConnectorError::Data(m) if m == "Trino error INVALID_CAST_ARGUMENT: a value does not convert to its column's type"
        ));
        assert!(matches!(
            classify(&error("JDBC_ERROR", "EXTERNAL")),
            ConnectorError::Transient(m) if m == "Trino error JDBC_ERROR"
        ));
        assert!(matches!(
            classify(&error("SOMETHING_NEW", "USER_ERROR")),
            ConnectorError::Config(m) if m == "Trino error SOMETHING_NEW"
        ));
        // A hostile server's name is cut to an identifier.
        let hostile = classify(&error(&format!("X'; {}", "<secret>".repeat(100)), "EXTERNAL")).to_string();
        assert!(hostile.len() < 90 && !hostile.contains('<'), "{hostile}");
    }

    #[test]
    fn literals_and_names_cannot_break_out() {
        assert_eq!(literal("it's"), "'it''s'");
        assert_eq!(literal("a' OR 1=1 --"), "'a'' OR 1=1 --'");
        assert_eq!(quote_ident("we\"ird"), "\"we\"\"ird\"");
        assert_eq!(quote_table("memory.default.t").unwrap(), "\"memory\".\"default\".\"t\"");
        assert!(quote_table("t; DROP TABLE x").is_err());
        assert!(quote_table("a.b.c.d").is_err());
    }

    #[test]
    fn values_ride_as_json_of_their_column_type() {
        use serde_json::json;
        assert_eq!(carried("bigint", None), Value::Null);
        assert_eq!(carried("bigint", Some(&json!(42))), json!("42"));
        assert_eq!(
            carried("decimal(30, 10)", Some(&json!("12345678901234567890.0123456789"))),
            json!("12345678901234567890.0123456789")
        );
        assert_eq!(carried("json", Some(&json!({"a": null}))), json!({"a": null}));
        assert_eq!(carried("array(bigint)", Some(&json!([1, 2]))), json!([1, 2]));
        // An object for a varchar column keeps its JSON text.
        assert_eq!(carried("varchar", Some(&json!({"k": "v"}))), json!("{\"k\":\"v\"}"));
        let columns = [
            Column {
                name: "id".into(),
                ty: "bigint".into(),
            },
            Column {
                name: "at".into(),
                ty: "timestamp(3) with time zone".into(),
            },
            Column {
                name: "we\"ird".into(),
                ty: "varbinary".into(),
            },
        ];
        let columns: Vec<&Column> = columns.iter().collect();
        assert_eq!(
            rows_select(&columns, "[[\"1\",null,\"it's\"]]"),
            "SELECT f0 AS \"id\", CAST(f1 AS timestamp(3) with time zone) AS \"at\", from_base64(f2) AS \"we\"\"ird\" \
             FROM UNNEST(CAST(json_parse('[[\"1\",null,\"it''s\"]]') AS array(row(f0 bigint, f1 varchar, f2 varchar)))) \
             AS x(f0, f1, f2)"
        );
    }

    #[test]
    fn rows_are_parsed_only_within_their_bounds() {
        let raw = |text: &str| serde_json::value::RawValue::from_string(text.to_owned()).unwrap();
        assert_eq!(
            rows_within(&raw("[[1,\"a\"],[2,null]]"), 2, 2).unwrap(),
            vec![
                vec![Value::from(1), Value::from("a")],
                vec![Value::from(2), Value::Null]
            ]
        );
        // One row more than asked for, one value more than the columns.
        assert!(rows_within(&raw("[[1],[2],[3]]"), 2, 1).is_err());
        assert!(rows_within(&raw("[[1,2]]"), 5, 1).is_err());
        assert!(rows_within(&raw("{\"not\": \"rows\"}"), 5, 1).is_err());
        let wide: Vec<PageColumn> = (0..=MAX_COLUMNS)
            .map(|i| PageColumn {
                name: format!("c{i}"),
                ty: "bigint".into(),
            })
            .collect();
        assert!(columns_within(wide).is_err());
    }

    #[test]
    fn json_columns_are_parsed_and_the_rest_kept() {
        let answer = Answer {
            columns: vec![
                Column {
                    name: "j".into(),
                    ty: "json".into(),
                },
                Column {
                    name: "n".into(),
                    ty: "decimal(20, 4)".into(),
                },
            ],
            rows: vec![vec![
                Value::String("{\"a\":null}".into()),
                Value::String("1.1000".into()),
            ]],
        };
        let rows = answer.objects();
        assert_eq!(rows[0]["j"], serde_json::json!({"a": null}));
        assert_eq!(rows[0]["n"], "1.1000");
    }
}
