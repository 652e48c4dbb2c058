//! The gateway's side of the engine link ([`crate::link`]): per serving
//! thread, one connection to each engine, opened on first use and again
//! once it breaks. A backend that does not answer the hello (ElasticMQ, or
//! any HTTP server) is spoken to over HTTP and asked again a minute later.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderValue;
use bytes::BytesMut;
use sless_runtime::sync::Unpoisoned;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use crate::link::{self, Answer};

/// How long a backend that answered the hello as HTTP is spoken to so.
const HTTP_FOR: Duration = Duration::from_secs(60);
/// Time to connect, and then for the engine's hello.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests queued for one link's writer; more wait for room.
const QUEUED: usize = 1024;
/// A link unused this long is opened afresh for the next request: half the
/// time after which the engine closes an idle link, so no request is ever
/// sent into a link the engine is closing.
const IDLE: Duration = Duration::from_secs(crate::link::IDLE_TIMEOUT.as_secs() / 2);

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("cannot reach the engine: {0}")]
    Connect(std::io::Error),
    #[error("cannot reach the engine within {OPEN_TIMEOUT:?}")]
    Timeout,
    #[error("the engine link closed before the answer came")]
    Closed,
    #[error("the engine refused the routing table's token")]
    Denied,
    #[error("the engine could not be reached a moment ago")]
    Down,
    /// The engine is closing the link and ran nothing of the request.
    #[error("the engine is closing the link")]
    Closing,
}

impl LinkError {
    /// Whether the request certainly never reached the engine.
    pub fn nothing_sent(&self) -> bool {
        !matches!(self, LinkError::Closed)
    }
}

/// How to reach one backend.
pub enum Way {
    Link(Link),
    Http,
}

enum State {
    Unknown,
    Open(Link),
    Http {
        until: Instant,
    },
    /// The engine refused the token (the routing table is behind): asked
    /// again only after a moment, not at every request.
    Denied {
        token: Option<HeaderValue>,
        until: Instant,
    },
    /// It could not be reached: requests fail at once for a moment (a
    /// route's other replicas take them) instead of each waiting to
    /// connect to a host that is gone.
    Down {
        until: Instant,
    },
}

/// How long an engine's refusal of a token is taken as its answer.
const DENIED_FOR: Duration = Duration::from_secs(1);
/// How long an engine that could not be reached is taken to be down.
const DOWN_FOR: Duration = Duration::from_secs(1);

struct Slot {
    state: State,
    /// Held while the link is being opened: one opening per backend.
    opening: Arc<tokio::sync::Mutex<()>>,
}

impl Slot {
    /// Whether it still serves or is being opened: an open link, a recent
    /// answer that the backend speaks HTTP, or an opening under way.
    fn live(&self) -> bool {
        match &self.state {
            State::Open(link) => link.is_open(),
            State::Http { until } | State::Denied { until, .. } | State::Down { until } => Instant::now() < *until,
            State::Unknown => Arc::strong_count(&self.opening) > 1,
        }
    }
}

/// What a thread knows of a backend now.
enum Known {
    Way(Way),
    /// It refused this token a moment ago.
    Denied,
    /// It could not be reached a moment ago.
    Down,
    /// Nothing current: open a link under this lock.
    Opening(Arc<tokio::sync::Mutex<()>>),
}

/// The links of one serving thread, by backend address.
#[derive(Clone, Default)]
pub struct Links(Arc<Mutex<HashMap<String, Slot>>>);

impl Links {
    /// How to reach `backend` now; opens a link to it if none is open.
    pub async fn way(&self, backend: &str, token: Option<&HeaderValue>) -> Result<Way, LinkError> {
        let opening = match self.known(backend, token) {
            Known::Way(way) => return Ok(way),
            Known::Denied => return Err(LinkError::Denied),
            Known::Down => return Err(LinkError::Down),
            Known::Opening(opening) => opening,
        };
        let _opening = opening.lock().await;
        // Another request may have opened it meanwhile.
        match self.known(backend, token) {
            Known::Way(way) => return Ok(way),
            Known::Denied => return Err(LinkError::Denied),
            Known::Down => return Err(LinkError::Down),
            Known::Opening(_) => {}
        }
        let mut unreachable = None;
        let state = match Link::open(backend, token).await {
            Ok(Some(link)) => State::Open(link),
            Ok(None) => {
                tracing::info!(backend, "the backend speaks HTTP, not the engine link");
                State::Http {
                    until: Instant::now() + HTTP_FOR,
                }
            }
            Err(LinkError::Denied) => {
                tracing::error!(backend, "the engine refused the routing table's token");
                State::Denied {
                    token: token.cloned(),
                    until: Instant::now() + DENIED_FOR,
                }
            }
            Err(e @ (LinkError::Connect(_) | LinkError::Timeout)) => {
                unreachable = Some(e);
                State::Down {
                    until: Instant::now() + DOWN_FOR,
                }
            }
            Err(e) => return Err(e),
        };
        let mut slots = self.0.lock_unpoisoned();
        let slot = slots.entry(backend.to_owned()).or_insert_with(|| Slot {
            state: State::Unknown,
            opening: opening.clone(),
        });
        slot.state = state;
        if let Some(e) = unreachable {
            return Err(e);
        }
        match &slot.state {
            State::Open(link) => Ok(Way::Link(link.clone())),
            State::Denied { .. } => Err(LinkError::Denied),
            _ => Ok(Way::Http),
        }
    }

    /// The way to `backend` if one is known and current, else the lock to
    /// open one under.
    fn known(&self, backend: &str, token: Option<&HeaderValue>) -> Known {
        let mut slots = self.0.lock_unpoisoned();
        let Some(slot) = slots.get(backend) else {
            // A backend new to this thread: the slots of backends gone
            // (a tenant's engine deleted) go, so they do not pile up.
            slots.retain(|_, slot| slot.live());
            let opening = Arc::new(tokio::sync::Mutex::new(()));
            slots.insert(
                backend.to_owned(),
                Slot {
                    state: State::Unknown,
                    opening: opening.clone(),
                },
            );
            return Known::Opening(opening);
        };
        match &slot.state {
            State::Open(link) if link.is_open() && !link.idle() && link.token.as_ref() == token => {
                Known::Way(Way::Link(link.clone()))
            }
            State::Http { until } if Instant::now() < *until => Known::Way(Way::Http),
            State::Denied { token: refused, until } if refused.as_ref() == token && Instant::now() < *until => {
                Known::Denied
            }
            State::Down { until } if Instant::now() < *until => Known::Down,
            _ => Known::Opening(slot.opening.clone()),
        }
    }
}

/// One connection to an engine: requests go to its writer, answers come
/// back by id from its reader.
#[derive(Clone)]
pub struct Link {
    requests: mpsc::Sender<Outgoing>,
    waiting: Arc<Mutex<Waiting>>,
    /// The token the hello presented.
    token: Option<HeaderValue>,
    /// When it was opened, and the last request sent after that (ms).
    opened: Instant,
    used: Arc<std::sync::atomic::AtomicU64>,
}

struct Outgoing {
    frame: BytesMut,
    reply: oneshot::Sender<Result<Answer, LinkError>>,
}

/// The requests written and not yet answered; closed once the reader
/// stops, after which nothing waits.
#[derive(Default)]
struct Waiting {
    closed: bool,
    /// The engine said it closes the link: nothing more is sent on it.
    closing: bool,
    replies: HashMap<u32, oneshot::Sender<Result<Answer, LinkError>>>,
}

impl Waiting {
    fn close(&mut self) {
        self.closed = true;
        for (_, reply) in self.replies.drain() {
            let _ = reply.send(Err(LinkError::Closed));
        }
    }
}

impl Link {
    /// Connects and says hello: `None` where the backend answers otherwise,
    /// or not within [`OPEN_TIMEOUT`] (a server that waits for more than a
    /// request's head is spoken to as what it is: HTTP).
    async fn open(backend: &str, token: Option<&HeaderValue>) -> Result<Option<Self>, LinkError> {
        let mut stream = tokio::time::timeout(OPEN_TIMEOUT, tokio::net::TcpStream::connect(backend))
            .await
            .map_err(|_| LinkError::Timeout)?
            .map_err(LinkError::Connect)?;
        let _ = stream.set_nodelay(true);
        let hello = link::hello_with(token.map_or(&[][..], |t| t.as_bytes()));
        let greeted = tokio::time::timeout(OPEN_TIMEOUT, async {
            stream.write_all(&hello).await?;
            link::read_hello(&mut stream).await
        })
        .await;
        match greeted {
            Ok(Ok(link::Greeting::Hello)) => {}
            Ok(Ok(link::Greeting::Denied)) => return Err(LinkError::Denied),
            Ok(Ok(link::Greeting::Other)) => return Ok(None),
            Ok(Err(e)) => return Err(LinkError::Connect(e)),
            Err(_) => {
                tracing::warn!(backend, "no answer to the engine link's hello; speaking HTTP to it");
                return Ok(None);
            }
        }
        let (read, write) = stream.into_split();
        let (requests, mut outgoing) = mpsc::channel::<Outgoing>(QUEUED);
        let waiting = Arc::new(Mutex::new(Waiting::default()));
        let writing = waiting.clone();
        tokio::spawn(async move {
            // Each request is numbered and its reply filed before its frame
            // goes out, so its answer always finds it.
            let mut next = 0u32;
            let file = |Outgoing { mut frame, reply }: Outgoing| {
                // Id 0 is the engine's notice that it closes the link.
                next = next.wrapping_add(1).max(1);
                link::set_id(&mut frame, next);
                let mut waiting = writing.lock_unpoisoned();
                if waiting.closed {
                    let _ = reply.send(Err(LinkError::Closed));
                    return None;
                }
                if waiting.closing {
                    let _ = reply.send(Err(LinkError::Closing));
                    return None;
                }
                waiting.replies.insert(next, reply);
                Some(frame)
            };
            if let Err(e) = link::write_frames(write, &mut outgoing, file).await {
                tracing::debug!(error = %e, "engine link write failed");
            }
            writing.lock_unpoisoned().close();
        });
        let answering = waiting.clone();
        tokio::spawn(async move {
            let mut frames = link::FrameReader::new(read, link::MAX_ANSWER);
            loop {
                let answer = match frames.next().await {
                    Ok(Some(frame)) => link::read_answer(frame),
                    Ok(None) => break,
                    Err(e) => Err(e),
                };
                match answer {
                    Ok(answer) => {
                        let mut waiting = answering.lock_unpoisoned();
                        let closing = link::is_closing(&answer);
                        waiting.closing |= closing;
                        if let Some(reply) = waiting.replies.remove(&answer.id) {
                            let _ = reply.send(if closing { Err(LinkError::Closing) } else { Ok(answer) });
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "engine link broken");
                        break;
                    }
                }
            }
            answering.lock_unpoisoned().close();
        });
        Ok(Some(Self {
            requests,
            waiting,
            token: token.cloned(),
            opened: Instant::now(),
            used: Arc::default(),
        }))
    }

    fn is_open(&self) -> bool {
        let waiting = self.waiting.lock_unpoisoned();
        !self.requests.is_closed() && !waiting.closed && !waiting.closing
    }

    /// Whether no request was sent on it for [`IDLE`]: the engine may soon
    /// close it. Dropped, it closes once its last answer is in.
    fn idle(&self) -> bool {
        let used = Duration::from_millis(self.used.load(std::sync::atomic::Ordering::Relaxed));
        self.opened.elapsed().saturating_sub(used) >= IDLE
    }

    /// Sends a request's frame (from [`link::request_frame`]) and waits
    /// for its answer.
    pub async fn call(&self, frame: BytesMut) -> Result<Answer, LinkError> {
        let since_opened = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.used.store(since_opened, std::sync::atomic::Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Outgoing { frame, reply })
            .await
            .map_err(|_| LinkError::Closed)?;
        answer.await.map_err(|_| LinkError::Closed)?
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use super::*;

    /// A stand-in engine that answers the hello; with `hang_up`, it then
    /// closes the connection at once.
    async fn stand_in(hang_up: bool) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut hello = [0u8; link::HELLO.len() + 2];
                if stream.read_exact(&mut hello).await.is_ok()
                    && stream.write_all(link::HELLO).await.is_ok()
                    && !hang_up
                {
                    held.push(stream);
                }
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_backend_silent_after_the_hello_is_spoken_to_over_http() {
        // Accepts and reads, never answers: as a server that waits for
        // more of a request than the hello sends would.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let started = Instant::now();
        assert!(matches!(Links::default().way(&addr, None).await.unwrap(), Way::Http));
        assert!(started.elapsed() >= OPEN_TIMEOUT);
    }

    #[tokio::test]
    async fn links_to_backends_gone_are_dropped_once_another_is_opened() {
        let links = Links::default();
        let gone = stand_in(true).await;
        assert!(matches!(links.way(&gone, None).await.unwrap(), Way::Link(_)));
        let deadline = Instant::now() + Duration::from_secs(5);
        while links.0.lock_unpoisoned()[&gone].live() {
            assert!(Instant::now() < deadline, "the link never saw its engine go");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let staying = stand_in(false).await;
        assert!(matches!(links.way(&staying, None).await.unwrap(), Way::Link(_)));
        let slots = links.0.lock_unpoisoned();
        assert!(!slots.contains_key(&gone), "the dead link's slot is gone");
        assert!(slots[&staying].live());
    }
}
