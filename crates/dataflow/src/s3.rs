//! The object store of Iceberg tables (the Nessie connector's data and
//! metadata files): S3's REST API, signed with SigV4 (sless-sqs's signer),
//! through clients of the egress policy, as Iceberg's `Storage`. Iceberg's
//! own S3 storage (opendal) brings an HTTP client of its own that the
//! policy would never see.
//!
//! Where it connects and with which keys: the spec's `awsEndpointURL`,
//! `awsRegion` and keys first, else what the catalog configured for the
//! table (`s3.endpoint`, `s3.region`, `s3.access-key-id`, …). An endpoint
//! the spec names is addressed path-style (`{endpoint}/{bucket}/{key}`, as
//! MinIO and other S3-compatible stores are); AWS's own, by the bucket's
//! host, unless the catalog says `s3.path-style-access`.
//!
//! Files are written whole with one PUT each (a data file holds one batch;
//! at most [`MAX_OBJECT`] bytes) and read by ranges.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use iceberg::io::{FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig, StorageFactory};
use iceberg::{Error, ErrorKind};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::egress::EgressPolicy;

/// The largest object read or written whole, and the largest range read.
pub const MAX_OBJECT: usize = 256 << 20;
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// What the spec says of the store; anything unset is the catalog's.
#[derive(Clone, Default)]
pub struct S3Settings {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
}

impl std::fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// Makes the [`S3Store`] of a table from the catalog's settings and the
/// spec's. Iceberg requires factories to be serialisable; this one is not
/// meant to travel (its policy and keys are skipped) and refuses to build
/// once it has.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct S3StoreFactory {
    #[serde(skip)]
    given: Option<Arc<(S3Settings, Arc<EgressPolicy>)>>,
}

impl S3StoreFactory {
    pub fn new(settings: S3Settings, egress: Arc<EgressPolicy>) -> Self {
        Self {
            given: Some(Arc::new((settings, egress))),
        }
    }
}

#[typetag::serde]
impl StorageFactory for S3StoreFactory {
    fn build(&self, config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        let (settings, egress) = self
            .given
            .as_deref()
            .ok_or_else(|| Error::new(ErrorKind::Unexpected, "the S3 store factory was not made here"))?;
        let from_catalog = |key: &str| config.get(key).filter(|v| !v.is_empty()).cloned();
        let region = settings
            .region
            .clone()
            .or_else(|| from_catalog("client.region"))
            .or_else(|| from_catalog("s3.region"))
            .unwrap_or_else(|| "us-east-1".to_owned());
        let (endpoint, path_style) = match &settings.endpoint {
            Some(endpoint) => (endpoint.clone(), true),
            None => (
                from_catalog("s3.endpoint").unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com")),
                from_catalog("s3.path-style-access").is_some_and(|v| matches!(v.as_str(), "true" | "t" | "1" | "on")),
            ),
        };
        let (scheme, authority) = endpoint
            .trim_end_matches('/')
            .split_once("://")
            .filter(|(scheme, authority)| matches!(*scheme, "http" | "https") && !authority.contains('/'))
            .map(|(s, a)| (s.to_owned(), a.to_owned()))
            .filter(|(_, authority)| !authority.contains('@'))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::DataInvalid,
                    "the S3 endpoint is not http(s)://host[:port] (without credentials)",
                )
            })?;
        // The Host header as the client sends it, which is what is signed.
        let authority = authority.to_ascii_lowercase();
        let default_port = if scheme == "https" { ":443" } else { ":80" };
        let authority = authority
            .strip_suffix(default_port)
            .map_or(authority.clone(), str::to_owned);
        let keys = match (&settings.access_key, &settings.secret_key) {
            (Some(access), Some(secret)) => Some(Keys {
                access: access.clone(),
                secret: secret.clone(),
                token: None,
            }),
            _ => match (from_catalog("s3.access-key-id"), from_catalog("s3.secret-access-key")) {
                (Some(access), Some(secret)) => Some(Keys {
                    access,
                    secret,
                    token: from_catalog("s3.session-token"),
                }),
                _ => None,
            },
        };
        Ok(Arc::new(S3Store {
            inner: Some(Arc::new(Inner {
                scheme,
                authority,
                path_style,
                region,
                keys,
                egress: egress.clone(),
                clients: tokio::sync::Mutex::new(HashMap::new()),
            })),
        }))
    }
}

#[derive(Clone)]
struct Keys {
    access: String,
    secret: String,
    token: Option<String>,
}

struct Inner {
    scheme: String,
    /// The endpoint's `host[:port]`.
    authority: String,
    path_style: bool,
    region: String,
    keys: Option<Keys>,
    egress: Arc<EgressPolicy>,
    /// A client of the policy per host (each bucket is a host of its own
    /// when addressed by host).
    clients: tokio::sync::Mutex<HashMap<String, reqwest::Client>>,
}

/// One table's object store.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct S3Store {
    #[serde(skip)]
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for S3Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("S3Store");
        if let Some(inner) = &self.inner {
            d.field("endpoint", &inner.authority).field("region", &inner.region);
        }
        d.finish_non_exhaustive()
    }
}

fn failed(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Unexpected, message)
}

/// `s3://bucket/key` (or `s3a://`, `s3n://`): the bucket and the key.
fn object_of(location: &str) -> iceberg::Result<(&str, &str)> {
    let rest = ["s3://", "s3a://", "s3n://"]
        .iter()
        .find_map(|scheme| location.strip_prefix(scheme))
        .ok_or_else(|| {
            Error::new(
                ErrorKind::FeatureUnsupported,
                format!("{location:?}: only s3:// locations are supported"),
            )
        })?;
    let (bucket, key) = rest
        .split_once('/')
        .filter(|(bucket, key)| !bucket.is_empty() && !key.is_empty())
        .ok_or_else(|| Error::new(ErrorKind::DataInvalid, format!("{location:?}: no bucket and key")))?;
    // The signer's canonical form removes dot segments, which S3 keeps.
    if key.split('/').any(|s| s == "." || s == "..") {
        return Err(Error::new(
            ErrorKind::DataInvalid,
            format!("{location:?}: keys with . or .. segments are not supported"),
        ));
    }
    Ok((bucket, key))
}

fn set(headers: &mut axum::http::HeaderMap, name: &'static str, value: &str) -> iceberg::Result<()> {
    let value = axum::http::HeaderValue::from_str(value)
        .map_err(|_| Error::new(ErrorKind::DataInvalid, format!("S3 header {name}: not a header value")))?;
    headers.insert(name, value);
    Ok(())
}

/// S3's `<Code>` of an error answer, if it has one.
fn s3_error(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let tag = |name: &str| {
        let open = format!("<{name}>");
        let start = text.find(&open)? + open.len();
        let end = text[start..].find("</")? + start;
        Some(text[start..end].chars().take(300).collect::<String>())
    };
    // The code only: S3's codes are a closed set of words, its messages
    // whatever the server wrote.
    tag("Code")
        .filter(|code| code.len() <= 64 && code.bytes().all(|b| b.is_ascii_alphanumeric()))
        .unwrap_or_default()
}

impl Inner {
    /// The URL of an object and the host it is on.
    fn url_of(&self, bucket: &str, key: &str) -> (String, String, String) {
        let encoded = sless_sqs::sigv4::uri_encode(key.as_bytes(), true);
        if self.path_style {
            (
                format!("{}://{}/{bucket}/{encoded}", self.scheme, self.authority),
                self.authority.clone(),
                format!("/{bucket}/{key}"),
            )
        } else {
            let host = format!("{bucket}.{}", self.authority);
            (format!("{}://{host}/{encoded}", self.scheme), host, format!("/{key}"))
        }
    }

    async fn client(&self, host: &str, url: &str) -> iceberg::Result<reqwest::Client> {
        let mut clients = self.clients.lock().await;
        if let Some(client) = clients.get(host) {
            return Ok(client.clone());
        }
        let client = self
            .egress
            .http_client(url, REQUEST_TIMEOUT)
            .await
            .map_err(|e| failed(format!("S3 at {host}: {e}")))?;
        clients.insert(host.to_owned(), client.clone());
        Ok(client)
    }

    /// Sends `method` on `location`'s object, signed, with `headers` and
    /// `body`: the answer read within [`MAX_OBJECT`].
    async fn send(
        &self,
        method: reqwest::Method,
        location: &str,
        headers: &[(&'static str, String)],
        body: Bytes,
    ) -> iceberg::Result<Reply> {
        let (bucket, key) = object_of(location)?;
        let (url, host, path) = self.url_of(bucket, key);
        let client = self.client(&host, &url).await?;
        let mut signed = axum::http::HeaderMap::new();
        let hash = sless_runtime::hex::encode(&Sha256::digest(&body));
        set(&mut signed, "host", &host)?;
        set(
            &mut signed,
            "x-amz-date",
            &sless_sqs::sigv4::amz_date(std::time::SystemTime::now()),
        )?;
        set(&mut signed, "x-amz-content-sha256", &hash)?;
        for (name, value) in headers {
            set(&mut signed, name, value)?;
        }
        if let Some(keys) = &self.keys {
            if let Some(token) = &keys.token {
                set(&mut signed, "x-amz-security-token", token)?;
            }
            let request = sless_sqs::sigv4::Request {
                method: method.as_str(),
                path: &path,
                query: None,
                headers: &signed,
                body: &body,
            };
            let authorization = sless_sqs::sigv4::sign_for(&request, &keys.access, &keys.secret, &self.region, "s3")
                .ok_or_else(|| failed("S3 request could not be signed"))?;
            set(&mut signed, "authorization", &authorization)?;
        }
        // The client sets Host itself.
        signed.remove("host");
        let response = client
            .request(method.clone(), &url)
            .headers(signed)
            .body(body)
            .send()
            .await
            .map_err(|e| {
                tracing::info!(error = %e, %host, "S3 request failed");
                failed(format!("S3 at {host} cannot be reached"))
            })?;
        let headers = response.headers().clone();
        let answer = sless_runtime::http::read_capped(response, MAX_OBJECT)
            .await
            .map_err(|e| failed(format!("S3 {method} {location}: {e}")))?;
        Ok(Reply {
            status: answer.status,
            headers,
            body: answer.body,
        })
    }

    /// As [`Self::send`], an answer other than 2xx an error naming it.
    async fn expect(
        &self,
        method: reqwest::Method,
        location: &str,
        headers: &[(&'static str, String)],
        body: Bytes,
    ) -> iceberg::Result<Bytes> {
        let answer = self.send(method.clone(), location, headers, body).await?;
        if answer.status.is_success() {
            return Ok(answer.body);
        }
        let kind = match answer.status.as_u16() {
            403 | 401 => "access denied",
            404 => "not found",
            _ => "failed",
        };
        Err(failed(format!(
            "S3 {method} {location}: {kind} (HTTP {}) {}",
            answer.status.as_u16(),
            s3_error(&answer.body)
        )))
    }

    /// The object's size, or `None` when there is none.
    async fn size(&self, location: &str) -> iceberg::Result<Option<u64>> {
        let answer = self.send(reqwest::Method::HEAD, location, &[], Bytes::new()).await?;
        match answer.status.as_u16() {
            404 => Ok(None),
            200 => answer
                .headers
                .get(reqwest::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .map(Some)
                .ok_or_else(|| failed(format!("S3 HEAD {location}: no Content-Length"))),
            status => Err(failed(format!("S3 HEAD {location}: HTTP {status}"))),
        }
    }
}

/// An answer of the store.
struct Reply {
    status: reqwest::StatusCode,
    headers: reqwest::header::HeaderMap,
    body: Bytes,
}

impl S3Store {
    fn inner(&self) -> iceberg::Result<&Inner> {
        self.inner
            .as_deref()
            .ok_or_else(|| failed("the S3 store was not made here"))
    }
}

#[async_trait]
#[typetag::serde]
impl Storage for S3Store {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        Ok(self.inner()?.size(path).await?.is_some())
    }

    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        let size = self.inner()?.size(path).await?;
        size.map(|size| FileMetadata { size })
            .ok_or_else(|| failed(format!("S3: no object {path}")))
    }

    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        self.inner()?
            .expect(reqwest::Method::GET, path, &[], Bytes::new())
            .await
    }

    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        Ok(Box::new(RangeReader {
            store: self.clone(),
            path: path.to_owned(),
        }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> iceberg::Result<()> {
        if bs.len() > MAX_OBJECT {
            return Err(failed(format!("S3: {path} is over {MAX_OBJECT} bytes")));
        }
        self.inner()?
            .expect(reqwest::Method::PUT, path, &[], bs)
            .await
            .map(drop)
    }

    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        Ok(Box::new(WholeWriter {
            store: self.clone(),
            path: path.to_owned(),
            buffer: Vec::new(),
        }))
    }

    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        let answer = self
            .inner()?
            .send(reqwest::Method::DELETE, path, &[], Bytes::new())
            .await?;
        match answer.status.as_u16() {
            200..=299 | 404 => Ok(()),
            status => Err(failed(format!(
                "S3 DELETE {path}: HTTP {status} {}",
                s3_error(&answer.body)
            ))),
        }
    }

    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        Err(Error::new(
            ErrorKind::FeatureUnsupported,
            format!("S3: deleting everything under {path} is not supported"),
        ))
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> iceberg::Result<()> {
        while let Some(path) = paths.next().await {
            self.delete(&path).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> iceberg::Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_owned()))
    }

    fn new_output(&self, path: &str) -> iceberg::Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_owned()))
    }
}

/// Reads ranges of one object.
struct RangeReader {
    store: S3Store,
    path: String,
}

#[async_trait]
impl FileRead for RangeReader {
    async fn read(&self, range: Range<u64>) -> iceberg::Result<Bytes> {
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        if range.end - range.start > MAX_OBJECT as u64 {
            return Err(failed(format!(
                "S3: a range of {} is over {MAX_OBJECT} bytes",
                self.path
            )));
        }
        let header = format!("bytes={}-{}", range.start, range.end - 1);
        let body = self
            .store
            .inner()?
            .expect(reqwest::Method::GET, &self.path, &[("range", header)], Bytes::new())
            .await?;
        if body.len() as u64 != range.end - range.start {
            return Err(failed(format!(
                "S3: {} bytes of {} answered for a range of {}",
                body.len(),
                self.path,
                range.end - range.start
            )));
        }
        Ok(body)
    }
}

/// Collects a file and writes it with one PUT when closed.
struct WholeWriter {
    store: S3Store,
    path: String,
    buffer: Vec<u8>,
}

#[async_trait]
impl FileWrite for WholeWriter {
    async fn write(&mut self, bs: Bytes) -> iceberg::Result<()> {
        if self.buffer.len() + bs.len() > MAX_OBJECT {
            return Err(failed(format!("S3: {} is over {MAX_OBJECT} bytes", self.path)));
        }
        self.buffer.extend_from_slice(&bs);
        Ok(())
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        let body = Bytes::from(std::mem::take(&mut self.buffer));
        self.store.write(&self.path, body).await
    }
}
