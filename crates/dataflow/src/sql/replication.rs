//! A client of PostgreSQL's logical replication sub-protocol: a connection
//! started with `replication=database`, which runs SQL and replication
//! commands (`CREATE_REPLICATION_SLOT`, `START_REPLICATION`) by the simple
//! query protocol and then streams WAL as CopyBoth data.
//!
//! tokio-postgres (the client the other connectors use) has no replication
//! mode and no CopyBoth, and `pgwire-replication` speaks only pgoutput
//! protocol 1 and brings a second TLS stack; this client is small, and uses
//! `postgres-protocol` (already in the tree through tokio-postgres) for the
//! frontend messages and SCRAM, and the connectors' own TLS and egress
//! path ([`super::Target`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BytesMut};
use postgres_protocol::authentication::sasl::{ChannelBinding, SCRAM_SHA_256, ScramSha256};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadHalf, WriteHalf};
use tokio_postgres::config::Host;

use super::Target;
use crate::ConnectorError;

/// The largest message read: a change (a row with its TOASTed values) or a
/// result row. PostgreSQL's own field limit is 1 GiB; a dataflow holding
/// one value that large is not what a tenant's budget allows.
pub const MAX_MESSAGE: usize = 256 << 20;
/// Longest the server may say nothing while streaming. The client asks for
/// a keepalive every [`KEEPALIVE_ASK`], so only a server or network gone
/// silent stays quiet this long; the run ends and connects again.
pub const SILENT_LIMIT: Duration = Duration::from_secs(120);
pub const KEEPALIVE_ASK: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    #[error("the connection to the PostgreSQL server broke: {0}")]
    Io(#[from] std::io::Error),
    /// The server's ErrorResponse.
    #[error("{message}")]
    Server { code: String, message: String },
    #[error("the PostgreSQL server sent {0}")]
    Protocol(String),
    #[error("a message of {0} bytes, over the {MAX_MESSAGE}-byte limit")]
    TooLarge(usize),
    #[error("the PostgreSQL server sent nothing for {0:?}")]
    Silent(Duration),
}

impl From<ReplicationError> for ConnectorError {
    fn from(e: ReplicationError) -> Self {
        match e {
            // Privileges, unknown objects, bad names: the spec or the role.
            ReplicationError::Server { code, message } if code.starts_with("42") || code.starts_with("28") => {
                ConnectorError::Config(message)
            }
            // The connection's state is unknown after any other failure:
            // the run ends and connects again.
            other => ConnectorError::Closed(other.to_string()),
        }
    }
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}
type Stream = Box<dyn Io>;

/// One message from the server: its tag and body.
struct Message {
    tag: u8,
    body: BytesMut,
}

async fn read_message<R: AsyncRead + Unpin>(r: &mut R) -> Result<Message, ReplicationError> {
    let tag = r.read_u8().await?;
    let len = r.read_i32().await?;
    let len = usize::try_from(len)
        .ok()
        .and_then(|l| l.checked_sub(4))
        .ok_or_else(|| ReplicationError::Protocol("a message length under 4".into()))?;
    if len > MAX_MESSAGE {
        return Err(ReplicationError::TooLarge(len));
    }
    let mut body = BytesMut::zeroed(len);
    r.read_exact(&mut body).await?;
    Ok(Message { tag, body })
}

/// The fields of an ErrorResponse.
fn server_error(body: &[u8]) -> ReplicationError {
    let (mut code, mut message) = (String::new(), String::new());
    for field in body.split(|b| *b == 0) {
        match field.split_first() {
            Some((b'C', rest)) => code = String::from_utf8_lossy(rest).into_owned(),
            Some((b'M', rest)) => message = String::from_utf8_lossy(rest).into_owned(),
            _ => {}
        }
    }
    ReplicationError::Server { code, message }
}

fn protocol(what: &str) -> ReplicationError {
    ReplicationError::Protocol(what.into())
}

/// A result set of the simple query protocol, as text.
#[derive(Debug, Default)]
pub struct Rows {
    /// Column names and type OIDs.
    pub columns: Vec<(String, u32)>,
    pub rows: Vec<Vec<Option<String>>>,
}

fn row_description(mut body: &[u8]) -> Result<Vec<(String, u32)>, ReplicationError> {
    let bad = || protocol("a malformed RowDescription");
    if body.len() < 2 {
        return Err(bad());
    }
    let count = body.get_u16() as usize;
    let mut columns = Vec::with_capacity(count.min(1600));
    for _ in 0..count {
        let end = body.iter().position(|b| *b == 0).ok_or_else(bad)?;
        let name = String::from_utf8_lossy(&body[..end]).into_owned();
        body = &body[end + 1..];
        // table OID, column number, type OID, size, modifier, format
        if body.len() < 18 {
            return Err(bad());
        }
        body.advance(6);
        let oid = body.get_u32();
        body.advance(8);
        columns.push((name, oid));
    }
    Ok(columns)
}

fn data_row(mut body: &[u8]) -> Result<Vec<Option<String>>, ReplicationError> {
    let bad = || protocol("a malformed DataRow");
    if body.len() < 2 {
        return Err(bad());
    }
    let count = body.get_u16() as usize;
    let mut values = Vec::with_capacity(count.min(1600));
    for _ in 0..count {
        if body.len() < 4 {
            return Err(bad());
        }
        let len = body.get_i32();
        if len < 0 {
            values.push(None);
            continue;
        }
        let len = len as usize;
        if body.len() < len {
            return Err(bad());
        }
        values.push(Some(String::from_utf8_lossy(&body[..len]).into_owned()));
        body.advance(len);
    }
    Ok(values)
}

/// A replication connection before streaming.
pub struct Connection {
    reader: BufReader<ReadHalf<Stream>>,
    writer: WriteHalf<Stream>,
    out: BytesMut,
    /// The server's major version (from its `server_version`).
    pub server_major: u32,
}

/// Connects to `target` with `replication=database` and authenticates.
pub async fn connect(target: &Target) -> Result<Connection, ConnectorError> {
    tokio::time::timeout(target.handshake_timeout(), start(target))
        .await
        .map_err(|_| super::silent())?
}

async fn start(target: &Target) -> Result<Connection, ConnectorError> {
    let config = &target.config;
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let Some(ip) = config.get_hostaddrs().first().copied() else {
        return Err(ConnectorError::Config(
            "change data capture connects over TCP, not a Unix socket".into(),
        ));
    };
    let mut tcp = tokio::net::TcpStream::connect((ip, port)).await.map_err(|e| {
        tracing::info!(error = %e, "PostgreSQL replication connection failed");
        ConnectorError::unreachable_database()
    })?;
    tcp.set_nodelay(true).map_err(ReplicationError::Io)?;
    let stream: Stream = match &target.tls {
        None => Box::new(tcp),
        Some(tls) => {
            let mut out = BytesMut::new();
            frontend::ssl_request(&mut out);
            tcp.write_all(&out).await.map_err(ReplicationError::Io)?;
            match tcp.read_u8().await.map_err(ReplicationError::Io)? {
                b'S' => {
                    let name = match &config.get_hosts()[0] {
                        Host::Tcp(name) => name.clone(),
                        #[cfg(unix)]
                        Host::Unix(_) => ip.to_string(),
                    };
                    let name = rustls::pki_types::ServerName::try_from(name)
                        .map_err(|_| ConnectorError::Config("the host is not a valid TLS server name".into()))?;
                    let tls = tokio_rustls::TlsConnector::from(tls.clone())
                        .connect(name, tcp)
                        .await
                        .map_err(|e| ConnectorError::Connect(format!("TLS: {e}")))?;
                    Box::new(tls)
                }
                b'N' if target.tls_optional => Box::new(tcp),
                b'N' => {
                    return Err(ConnectorError::Connect(
                        "the server does not offer TLS, which sslmode requires".into(),
                    ));
                }
                _ => return Err(ReplicationError::Protocol("an unknown answer to the TLS request".into()).into()),
            }
        }
    };
    let (read, writer) = tokio::io::split(stream);
    let mut connection = Connection {
        reader: BufReader::with_capacity(64 << 10, read),
        writer,
        out: BytesMut::new(),
        server_major: 0,
    };
    connection.startup(config).await?;
    Ok(connection)
}

impl Connection {
    async fn send(&mut self) -> Result<(), ReplicationError> {
        self.writer.write_all(&self.out).await?;
        self.writer.flush().await?;
        self.out.clear();
        Ok(())
    }

    async fn startup(&mut self, config: &tokio_postgres::Config) -> Result<(), ConnectorError> {
        let user = config
            .get_user()
            .ok_or_else(|| ConnectorError::Config("connectionString names no user".into()))?;
        let database = config.get_dbname().unwrap_or(user);
        let application = config.get_application_name().unwrap_or("sless");
        let mut params = vec![
            ("user", user),
            ("database", database),
            ("replication", "database"),
            ("application_name", application),
            ("client_encoding", "UTF8"),
        ];
        if let Some(options) = config.get_options() {
            params.push(("options", options));
        }
        frontend::startup_message(params.iter().copied(), &mut self.out).map_err(ReplicationError::Io)?;
        self.send().await?;
        let password = config.get_password();
        let need_password =
            || ConnectorError::Config("the server asks for a password the connectionString lacks".into());
        let mut scram: Option<ScramSha256> = None;
        loop {
            let mut m = read_message(&mut self.reader).await?;
            match m.tag {
                b'R' => {
                    if m.body.len() < 4 {
                        return Err(protocol("a malformed authentication request").into());
                    }
                    let kind = m.body.get_i32();
                    match kind {
                        0 => {}
                        3 => {
                            frontend::password_message(password.ok_or_else(need_password)?, &mut self.out)
                                .map_err(ReplicationError::Io)?;
                            self.send().await?;
                        }
                        5 => {
                            if m.body.len() < 4 {
                                return Err(protocol("a malformed MD5 request").into());
                            }
                            let salt = [m.body[0], m.body[1], m.body[2], m.body[3]];
                            let hash = postgres_protocol::authentication::md5_hash(
                                user.as_bytes(),
                                password.ok_or_else(need_password)?,
                                salt,
                            );
                            frontend::password_message(hash.as_bytes(), &mut self.out).map_err(ReplicationError::Io)?;
                            self.send().await?;
                        }
                        10 => {
                            let offered = m.body[..]
                                .split(|b| *b == 0)
                                .any(|name| name == SCRAM_SHA_256.as_bytes());
                            if !offered {
                                return Err(ConnectorError::Config(
                                    "the server offers no SASL mechanism this client speaks".into(),
                                ));
                            }
                            let s =
                                ScramSha256::new(password.ok_or_else(need_password)?, ChannelBinding::unsupported());
                            frontend::sasl_initial_response(SCRAM_SHA_256, s.message(), &mut self.out)
                                .map_err(ReplicationError::Io)?;
                            self.send().await?;
                            scram = Some(s);
                        }
                        11 => {
                            let s = scram.as_mut().ok_or_else(|| protocol("SASL data before SASL"))?;
                            s.update(&m.body)
                                .map_err(|_| protocol("a SCRAM message this client refuses"))?;
                            frontend::sasl_response(s.message(), &mut self.out).map_err(ReplicationError::Io)?;
                            self.send().await?;
                        }
                        12 => {
                            let s = scram.as_mut().ok_or_else(|| protocol("SASL data before SASL"))?;
                            // A server that cannot prove it knows the password is refused.
                            s.finish(&m.body)
                                .map_err(|_| ConnectorError::Connect("the server failed SCRAM verification".into()))?;
                        }
                        _ => {
                            return Err(ConnectorError::Config(
                                "the server asks for an authentication method this client does not speak \
                                 (password, md5 and scram-sha-256 are spoken)"
                                    .into(),
                            ));
                        }
                    }
                }
                b'E' => {
                    return Err(match server_error(&m.body) {
                        ReplicationError::Server { message, .. } => ConnectorError::Connect(message),
                        other => other.into(),
                    });
                }
                b'Z' => return Ok(()),
                // ParameterStatus, BackendKeyData, NoticeResponse
                b'S' => {
                    let mut fields = m.body[..].split(|b| *b == 0);
                    if fields.next() == Some(b"server_version".as_slice()) {
                        let version = fields.next().map(String::from_utf8_lossy).unwrap_or_default();
                        self.server_major = version
                            .split(|c: char| !c.is_ascii_digit())
                            .next()
                            .and_then(|major| major.parse().ok())
                            .unwrap_or(0);
                    }
                }
                b'K' | b'N' => {}
                _ => return Err(protocol("an unexpected message during the connection's start").into()),
            }
        }
    }

    /// Runs one statement (SQL or a replication command) and returns its
    /// rows as text.
    pub async fn query(&mut self, sql: &str) -> Result<Rows, ReplicationError> {
        frontend::query(sql, &mut self.out)?;
        self.send().await?;
        let mut rows = Rows::default();
        let mut failed = None;
        loop {
            let m = read_message(&mut self.reader).await?;
            match m.tag {
                b'T' => rows.columns = row_description(&m.body)?,
                b'D' => rows.rows.push(data_row(&m.body)?),
                b'E' => failed = Some(server_error(&m.body)),
                b'Z' => {
                    return match failed {
                        Some(e) => Err(e),
                        None => Ok(rows),
                    };
                }
                b'C' | b'I' | b'N' | b'S' => {}
                _ => return Err(protocol("an unexpected message answering a query")),
            }
        }
    }

    /// `START_REPLICATION … LOGICAL` of `slot` from `start` with the
    /// plugin `options` (already quoted as the command takes them).
    pub async fn start_replication(
        mut self,
        slot: &str,
        start: u64,
        options: &str,
    ) -> Result<(ChangeStream, StatusWriter), ReplicationError> {
        let sql = format!(
            "START_REPLICATION SLOT \"{slot}\" LOGICAL {:X}/{:X} ({options})",
            start >> 32,
            start & 0xFFFF_FFFF
        );
        frontend::query(&sql, &mut self.out)?;
        self.send().await?;
        loop {
            let m = read_message(&mut self.reader).await?;
            match m.tag {
                b'W' => break,
                b'E' => {
                    // The ReadyForQuery that follows is not waited for: the
                    // connection is dropped with the error.
                    return Err(server_error(&m.body));
                }
                b'N' | b'S' => {}
                _ => return Err(protocol("an unexpected answer to START_REPLICATION")),
            }
        }
        Ok((
            ChangeStream { reader: self.reader },
            StatusWriter {
                writer: self.writer,
                out: self.out,
            },
        ))
    }
}

/// What the server streams.
#[derive(Debug)]
pub enum Streamed {
    /// XLogData: a pgoutput message whose WAL starts at `start`.
    Data { start: u64, data: BytesMut },
    /// Primary keepalive: the server has sent WAL up to `wal_end`; `reply`
    /// when it wants a status update at once.
    Keepalive { wal_end: u64, reply: bool },
}

/// The reading half of a started replication.
pub struct ChangeStream {
    reader: BufReader<ReadHalf<Stream>>,
}

impl ChangeStream {
    /// Whether more of what the server sent is read already: the next
    /// message (or part of it) comes without waiting.
    pub fn buffered(&self) -> bool {
        !self.reader.buffer().is_empty()
    }

    /// The next message, failing after [`SILENT_LIMIT`] of silence.
    pub async fn next(&mut self) -> Result<Streamed, ReplicationError> {
        loop {
            let mut m = tokio::time::timeout(SILENT_LIMIT, read_message(&mut self.reader))
                .await
                .map_err(|_| ReplicationError::Silent(SILENT_LIMIT))??;
            match m.tag {
                b'd' => {
                    let bad = || protocol("a malformed replication message");
                    let kind = *m.body.first().ok_or_else(bad)?;
                    match kind {
                        b'w' if m.body.len() >= 25 => {
                            m.body.advance(1);
                            let start = m.body.get_u64();
                            m.body.advance(16); // the WAL end and send time
                            return Ok(Streamed::Data { start, data: m.body });
                        }
                        b'k' if m.body.len() >= 18 => {
                            m.body.advance(1);
                            let wal_end = m.body.get_u64();
                            m.body.advance(8);
                            return Ok(Streamed::Keepalive {
                                wal_end,
                                reply: m.body.get_u8() == 1,
                            });
                        }
                        _ => return Err(bad()),
                    }
                }
                b'E' => return Err(server_error(&m.body)),
                b'c' => return Err(protocol("the end of the replication stream")),
                b'N' | b'S' => {}
                _ => return Err(protocol("an unexpected message in the replication stream")),
            }
        }
    }
}

/// The writing half of a started replication: standby status updates.
pub struct StatusWriter {
    writer: WriteHalf<Stream>,
    out: BytesMut,
}

/// Microseconds since 2000-01-01, the protocol's clock.
fn pg_now() -> i64 {
    const PG_EPOCH_SECS: u64 = 946_684_800;
    let since_unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let micros = since_unix.as_micros() as i64;
    micros - (PG_EPOCH_SECS as i64) * 1_000_000
}

impl StatusWriter {
    /// Tells the server that everything before `flushed` is written
    /// downstream (the slot may move there), asking for a keepalive back
    /// when `ask`.
    pub async fn status(&mut self, flushed: u64, ask: bool) -> Result<(), ReplicationError> {
        let mut body = BytesMut::with_capacity(34);
        body.extend_from_slice(b"r");
        for _ in 0..3 {
            body.extend_from_slice(&flushed.to_be_bytes());
        }
        body.extend_from_slice(&pg_now().to_be_bytes());
        body.extend_from_slice(&[u8::from(ask)]);
        frontend::CopyData::new(&body[..])?.write(&mut self.out);
        self.writer.write_all(&self.out).await?;
        self.writer.flush().await?;
        self.out.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lengths_over_the_limit_or_under_four_are_refused_before_reading() {
        let mut huge = vec![b'd'];
        huge.extend(i32::MAX.to_be_bytes());
        assert!(matches!(
            read_message(&mut &huge[..]).await,
            Err(ReplicationError::TooLarge(_))
        ));
        let mut short = vec![b'd'];
        short.extend(3i32.to_be_bytes());
        assert!(matches!(
            read_message(&mut &short[..]).await,
            Err(ReplicationError::Protocol(_))
        ));
        let mut cut = vec![b'd'];
        cut.extend(100i32.to_be_bytes());
        cut.extend([0; 10]);
        assert!(matches!(
            read_message(&mut &cut[..]).await,
            Err(ReplicationError::Io(_))
        ));
    }

    #[test]
    fn malformed_rows_are_errors_not_panics() {
        assert!(row_description(&[0, 2, b'a', 0]).is_err());
        assert!(data_row(&[0, 1, 0, 0, 0, 9, b'x']).is_err());
        assert_eq!(
            data_row(&[0, 2, 255, 255, 255, 255, 0, 0, 0, 1, b'x']).unwrap(),
            vec![None, Some("x".to_owned())]
        );
        match server_error(b"SERROR\0C55000\0Mslot is lost\0\0") {
            ReplicationError::Server { code, message } => {
                assert_eq!((code.as_str(), message.as_str()), ("55000", "slot is lost"));
            }
            other => panic!("{other:?}"),
        }
    }
}
