//! HTTP with parties nobody vouches for. Reading an answer from a server a
//! tenant names ([`read_capped`]): within a cap, refusing a redirect.
//! Serving HTTP/1.1 to clients nobody vouches for: the REST API and the
//! SQS gateway face tenants and anonymous clients alike, so a connection
//! is admitted only within a cap in total and per client address, must
//! send a request's headers within a timeout (which also ends a keep-alive
//! connection that stays idle that long) and its body within another, and
//! is closed at shutdown once its request in flight is answered. A
//! connection over a cap is accepted and closed at once, so the listen
//! backlog never fills with them.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::sync::Unpoisoned;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How many connections a server takes, and how long it waits for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct ConnectionLimits {
    /// Most open client connections in total; more are closed at once.
    #[arg(long = "max-connections", default_value_t = 16_384)]
    pub total: usize,
    /// Most open connections from one client address (0: no such cap, for
    /// a server behind a proxy that caps clients itself).
    #[arg(long = "max-connections-per-client", default_value_t = 512)]
    pub per_client: usize,
    /// Seconds a client has to send a request's headers, counted from the
    /// end of the answer before it on a keep-alive connection: also the
    /// longest a connection stays idle.
    #[arg(long = "header-timeout", default_value = "30s", value_parser = humantime::parse_duration)]
    pub header_timeout: Duration,
    /// Longest a client may take to send a request's body once its headers
    /// are in; a body still arriving then is an error.
    #[arg(long = "body-timeout", default_value = "30s", value_parser = humantime::parse_duration)]
    pub body_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            total: 16_384,
            per_client: 512,
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
        }
    }
}

impl ConnectionLimits {
    /// These limits with at most `connections` open in total.
    pub fn within(self, connections: usize) -> Self {
        Self {
            total: self.total.min(connections.max(1)),
            ..self
        }
    }
}

/// Taken for "no limit": more descriptors than any cap here needs.
const UNLIMITED: u64 = 1 << 20;

/// The most file descriptors this process may hold (its soft limit).
/// Every connection a server admits takes one, so the caps of a process's
/// servers together must stay below it, or a flood of connections leaves
/// none for the rest of the process.
pub fn descriptor_limit() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    usize::try_from(soft.unwrap_or(UNLIMITED).min(UNLIMITED)).unwrap_or(usize::MAX)
}

/// Raises this process's soft descriptor limit to its hard limit, as Go's
/// runtime does at start, and returns [`descriptor_limit`].
pub fn raise_descriptor_limit() -> usize {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(UNLIMITED);
    if limit.current.is_some_and(|soft| soft < hard) {
        let wanted = Rlimit {
            current: Some(hard),
            maximum: limit.maximum,
        };
        if let Err(error) = setrlimit(Resource::Nofile, wanted) {
            tracing::warn!(%error, hard, "cannot raise the descriptor limit");
        }
    }
    descriptor_limit()
}

/// The error of a body not received within its time.
#[derive(Debug, thiserror::Error)]
#[error("the request body was not received within {0:?}")]
pub struct BodyTimeout(pub Duration);

/// A request body that fails once its time is up.
struct Deadline {
    body: hyper::body::Incoming,
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

impl hyper::body::Body for Deadline {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        use std::task::Poll;
        let this = &mut *self;
        match std::pin::Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending if this.sleep.as_mut().poll(cx).is_ready() => {
                Poll::Ready(Some(Err(Box::new(BodyTimeout(this.timeout)))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The connections a server holds now, by client address.
#[derive(Debug)]
pub struct Admission {
    limits: ConnectionLimits,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub struct Admitted {
    admission: Arc<Admission>,
    peer: IpAddr,
}

impl Admission {
    pub fn new(limits: ConnectionLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            open: Mutex::default(),
        })
    }

    /// A place for a connection from `peer`, if both caps leave one.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Admitted> {
        let peer = client_of(peer);
        let mut open = self.open.lock_unpoisoned();
        let (total, by_peer) = &mut *open;
        let mine = by_peer.get(&peer).copied().unwrap_or(0);
        if *total >= self.limits.total || (self.limits.per_client > 0 && mine >= self.limits.per_client) {
            return None;
        }
        *total += 1;
        by_peer.insert(peer, mine + 1);
        Some(Admitted {
            admission: self.clone(),
            peer,
        })
    }

    pub fn limits(&self) -> ConnectionLimits {
        self.limits
    }

    /// Open connections: in total, and from `peer`.
    #[cfg(test)]
    fn open(&self, peer: IpAddr) -> (usize, usize) {
        let open = self.open.lock_unpoisoned();
        (open.0, open.1.get(&peer).copied().unwrap_or(0))
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.admission.open.lock_unpoisoned();
        let (total, by_peer) = &mut *open;
        *total = total.saturating_sub(1);
        if let Some(n) = by_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                by_peer.remove(&self.peer);
            }
        }
    }
}

/// The client a per-client cap counts a peer address as: an IPv6 address
/// by its /64 (the least a site is given, so one host may hold all of
/// it), an IPv4-mapped one as its IPv4 address.
fn client_of(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(_) => peer,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

/// Accepts the next connection that `admission` admits; the others are
/// closed as they come. Failing accepts (out of file descriptors) are
/// waited out, as axum does.
pub async fn accept(listener: &TcpListener, admission: &Arc<Admission>) -> (TcpStream, SocketAddr, Admitted) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => match admission.admit(peer.ip()) {
                Some(admitted) => return (stream, peer, admitted),
                None => {
                    tracing::debug!(%peer, "connection over the cap closed");
                    drop(stream);
                }
            },
            Err(error) => {
                tracing::warn!(%error, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves one connection with `app` until the client closes it, its
/// header timeout passes, or `stop` turns true (then the request in flight
/// is answered first). `admitted` is held for as long.
pub async fn serve_connection(
    stream: TcpStream,
    app: axum::Router,
    admitted: Admitted,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<bool>,
) {
    use tower::ServiceExt;
    let _ = stream.set_nodelay(true);
    let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        let request = request.map(|body| {
            axum::body::Body::new(Deadline {
                body,
                sleep: Box::pin(tokio::time::sleep(limits.body_timeout)),
                timeout: limits.body_timeout,
            })
        });
        app.clone().oneshot(request)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let connection = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        () = async { drop(stop.wait_for(|s| *s).await) } => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
    drop(admitted);
}

/// Serves `app` on `listener` within `limits` until `shutdown` resolves,
/// then waits for the requests in flight.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    serve_each(listener, limits, shutdown, move |stream, admitted, stop| {
        serve_connection(stream, app.clone(), admitted, limits, stop)
    })
    .await;
}

/// Accepts on `listener` within `limits` until `shutdown` resolves, each
/// connection served by `connection` in a task of its own, which is told
/// to stop through its receiver; then waits for them all to end.
pub async fn serve_each<F, C>(
    listener: TcpListener,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
    connection: C,
) where
    C: Fn(TcpStream, Admitted, watch::Receiver<bool>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    serve_admitted(listener, Admission::new(limits), shutdown, connection).await;
}

/// As [`serve_each`], within the caps of `admission`, which other servers
/// of the process may share.
pub async fn serve_admitted<F, C>(
    listener: TcpListener,
    admission: Arc<Admission>,
    shutdown: impl Future<Output = ()>,
    connection: C,
) where
    C: Fn(TcpStream, Admitted, watch::Receiver<bool>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            (stream, _, admitted) = accept(&listener, &admission) => {
                connections.spawn(connection(stream, admitted, stop_rx.clone()));
            }
            // Reap finished connections as they end.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    while connections.join_next().await.is_some() {}
}

/// An HTTP answer read whole, within its cap.
#[derive(Debug)]
pub struct Answer {
    pub status: reqwest::StatusCode,
    pub body: bytes::Bytes,
}

/// Why an answer was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("answered with a redirect (HTTP {0}); redirects are not followed")]
    Redirect(u16),
    #[error("answered with more than {0} bytes")]
    TooLong(usize),
    #[error("the answer broke off: {0}")]
    Transport(#[source] reqwest::Error),
    #[error("the answer is not read further: {0}")]
    Refused(String),
}

/// Reads `response` to its end, at most `cap` bytes: a longer answer is
/// refused when it declares its length, and otherwise as soon as it passes
/// the cap, never held whole. A redirect is refused: a client that follows
/// none must not take one's body for the answer.
pub async fn read_capped(response: reqwest::Response, cap: usize) -> Result<Answer, ReadError> {
    read_capped_each(response, cap, |_| Ok(())).await
}

/// As [`read_capped`], asking `arrived` before each chunk is kept (with its
/// length): its refusal ends the read with [`ReadError::Refused`].
pub async fn read_capped_each(
    mut response: reqwest::Response,
    cap: usize,
    mut arrived: impl FnMut(usize) -> Result<(), String>,
) -> Result<Answer, ReadError> {
    let status = response.status();
    if status.is_redirection() {
        return Err(ReadError::Redirect(status.as_u16()));
    }
    if response.content_length().is_some_and(|n| n > cap as u64) {
        return Err(ReadError::TooLong(cap));
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| ReadError::Transport(e.without_url()))?
    {
        if body.len() + chunk.len() > cap {
            return Err(ReadError::TooLong(cap));
        }
        arrived(chunk.len()).map_err(ReadError::Refused)?;
        body.extend_from_slice(&chunk);
    }
    Ok(Answer {
        status,
        body: body.freeze(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_in_total_and_per_client() {
        let admission = Admission::new(ConnectionLimits {
            total: 3,
            per_client: 2,
            ..ConnectionLimits::default()
        });
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let first = admission.admit(a).unwrap();
        let _second = admission.admit(a).unwrap();
        assert!(admission.admit(a).is_none(), "a third from one client");
        let _third = admission.admit(b).unwrap();
        assert!(admission.admit(b).is_none(), "a fourth in all");
        drop(first);
        assert_eq!(admission.open(a), (2, 1));
        assert!(admission.admit(b).is_some());
        // 0: no per-client cap.
        let open = Admission::new(ConnectionLimits {
            total: 10,
            per_client: 0,
            ..ConnectionLimits::default()
        });
        let held: Vec<_> = (0..10).filter_map(|_| open.admit(a)).collect();
        assert_eq!(held.len(), 10);
    }

    #[test]
    fn ipv6_clients_are_counted_by_their_64() {
        let admission = Admission::new(ConnectionLimits {
            total: 100,
            per_client: 2,
            ..ConnectionLimits::default()
        });
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let same_64: IpAddr = "2001:db8:1:2:ffff:ffff:ffff:fffe".parse().unwrap();
        let next_64: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let _first = admission.admit(one).unwrap();
        let _second = admission.admit(same_64).unwrap();
        assert!(admission.admit(one).is_none(), "a third from one /64");
        assert!(admission.admit(next_64).is_some(), "another /64 is another client");
        // An IPv4-mapped address is its IPv4 client.
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        let _v4 = admission.admit(v4).unwrap();
        let _mapped = admission.admit(mapped).unwrap();
        assert!(admission.admit(v4).is_none());
    }
}
