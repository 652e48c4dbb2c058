//! Room for request bodies in the gateway's memory. A body is read before
//! its signature can be checked (SigV4 signs the payload's hash), so a
//! client that knows only an access key id (key ids are not secrets) must
//! not be able to hold room that other requests need:
//!
//! - room is taken for bytes that arrived, never for a declared length;
//! - each tenant (named by the key id) holds at most its share, so a key id
//!   can crowd out only its own tenant's requests;
//! - a body must keep arriving at [`MIN_RATE`] after a short grace, so a
//!   stalled upload gives its room back within seconds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use sless_runtime::sync::Unpoisoned;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// As the engine's: a full 1 MiB batch, URL-encoded, with overhead.
pub const BODY_LIMIT: usize = 8 * 1024 * 1024;
/// Most request bodies' bytes the gateway holds at once, over all
/// connections, threads and tenants.
pub const BODIES_IN_MEMORY: usize = 256 << 20;
/// Most of that one tenant's requests hold at once.
pub const TENANT_BODIES: usize = 64 << 20;
/// Slowest a body may arrive, averaged from the end of its headers once
/// [`GRACE`] has passed.
pub const MIN_RATE: usize = 64 * 1024;
/// Time a body has before [`MIN_RATE`] applies.
pub const GRACE: Duration = Duration::from_secs(2);
/// Longest a body's first bytes wait for room; later bytes, which already
/// hold some, wait [`HOLDING_WAIT`] at most, so that bodies holding part of
/// the room never wait on each other for long.
const ROOM_TIMEOUT: Duration = Duration::from_secs(10);
const HOLDING_WAIT: Duration = Duration::from_secs(1);

/// Why a body was not read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BodyError {
    #[error("the gateway holds as many request bodies as it may; retry")]
    Busy,
    #[error("the request body is longer than {BODY_LIMIT} bytes")]
    TooLong,
    #[error("the request body arrived slower than {MIN_RATE} bytes a second")]
    TooSlow,
    #[error("the request body was not received in time or whole")]
    Broken,
}

/// The room bodies take: in all, and per tenant.
pub struct BodyBudget {
    total: Arc<Semaphore>,
    share: usize,
    tenants: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// The room one body holds, given back when it drops.
#[derive(Default)]
pub struct Room {
    tenant: Option<OwnedSemaphorePermit>,
    total: Option<OwnedSemaphorePermit>,
}

impl Room {
    fn holds(&self) -> bool {
        self.total.is_some()
    }

    fn add(&mut self, tenant: OwnedSemaphorePermit, total: OwnedSemaphorePermit) {
        match (&mut self.tenant, &mut self.total) {
            (Some(t), Some(a)) => {
                t.merge(tenant);
                a.merge(total);
            }
            _ => {
                self.tenant = Some(tenant);
                self.total = Some(total);
            }
        }
    }
}

impl BodyBudget {
    pub fn new(total: usize, share: usize) -> Self {
        Self {
            total: Arc::new(Semaphore::new(total)),
            share,
            tenants: Mutex::default(),
        }
    }

    /// `tenant`'s part of the room. Parts nobody holds are dropped as the
    /// map grows, so it holds at most the tenants with bodies in flight.
    fn part(&self, tenant: &str) -> Arc<Semaphore> {
        let mut tenants = self.tenants.lock_unpoisoned();
        if let Some(part) = tenants.get(tenant) {
            return part.clone();
        }
        if tenants.len() >= 64 {
            tenants.retain(|_, part| Arc::strong_count(part) > 1);
        }
        let part = Arc::new(Semaphore::new(self.share));
        tenants.insert(tenant.to_owned(), part.clone());
        part
    }

    /// Room for `bytes` more of `tenant`'s body held in `room`: the
    /// tenant's part first, so a tenant over its share waits without
    /// holding shared room.
    async fn take(&self, tenant: &Arc<Semaphore>, room: &mut Room, bytes: usize) -> Result<(), BodyError> {
        let Ok(n) = u32::try_from(bytes) else {
            return Err(BodyError::TooLong);
        };
        if n == 0 {
            return Ok(());
        }
        let wait = if room.holds() { HOLDING_WAIT } else { ROOM_TIMEOUT };
        let taken = tokio::time::timeout(wait, async {
            let mine = tenant.clone().acquire_many_owned(n).await.ok()?;
            let shared = self.total.clone().acquire_many_owned(n).await.ok()?;
            Some((mine, shared))
        })
        .await;
        match taken {
            Ok(Some((mine, shared))) => {
                room.add(mine, shared);
                Ok(())
            }
            _ => Err(BodyError::Busy),
        }
    }

    /// Reads `body` of `tenant`'s request whole, taking room as its bytes
    /// arrive; the room is held until the [`Room`] drops.
    pub async fn read(&self, tenant: &str, body: Body) -> Result<(Bytes, Room), BodyError> {
        let part = self.part(tenant);
        let mut room = Room::default();
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut len = 0usize;
        let mut body = std::pin::pin!(body);
        // Time spent waiting for room is not the client's.
        let mut started = Instant::now();
        loop {
            let due = started + GRACE + Duration::from_secs_f64(len as f64 / MIN_RATE as f64);
            let frame = match tokio::time::timeout_at(due, body.frame()).await {
                Err(_) => return Err(BodyError::TooSlow),
                Ok(None) => break,
                Ok(Some(Err(e))) if is_length_limit(&e) => return Err(BodyError::TooLong),
                Ok(Some(Err(_))) => return Err(BodyError::Broken),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else { continue };
            if len + data.len() > BODY_LIMIT {
                return Err(BodyError::TooLong);
            }
            let waiting = Instant::now();
            self.take(&part, &mut room, data.len()).await?;
            started += waiting.elapsed();
            len += data.len();
            chunks.push(data);
        }
        Ok((concat(chunks, len), room))
    }
}

/// The chunks of a body as one buffer (the one chunk as it is).
fn concat(mut chunks: Vec<Bytes>, len: usize) -> Bytes {
    if chunks.len() == 1 {
        return chunks.pop().unwrap_or_default();
    }
    let mut whole = BytesMut::with_capacity(len);
    for chunk in chunks {
        whole.extend_from_slice(&chunk);
    }
    whole.freeze()
}

/// Whether reading a body failed on a length limit.
fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;

    /// A body of `chunks` that then stalls, as a client that stops sending.
    fn stalling(chunks: Vec<Bytes>) -> Body {
        let sent = futures_util::stream::iter(chunks.into_iter().map(Ok::<_, std::io::Error>));
        Body::from_stream(sent.chain(futures_util::stream::pending()))
    }

    fn whole(chunks: Vec<Bytes>) -> Body {
        Body::from_stream(futures_util::stream::iter(
            chunks.into_iter().map(Ok::<_, std::io::Error>),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_holds_only_what_arrived_and_ends_after_the_grace() {
        let budget = Arc::new(BodyBudget::new(1 << 20, 1 << 19));
        let reading = tokio::spawn({
            let budget = budget.clone();
            async move { budget.read("a", stalling(vec![Bytes::from(vec![1; 1024])])).await.err() }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(budget.total.available_permits(), (1 << 20) - 1024);
        let started = Instant::now();
        assert_eq!(reading.await.unwrap(), Some(BodyError::TooSlow));
        // 1 KiB at 64 KiB/s buys 1/64 s beyond the grace.
        assert!(started.elapsed() < GRACE, "{:?}", started.elapsed());
        assert_eq!(budget.total.available_permits(), 1 << 20, "the room is back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_arriving_at_the_rate_is_read_whole() {
        let budget = BodyBudget::new(1 << 20, 1 << 19);
        // 64 KiB every half second: twice the least rate.
        let chunks = futures_util::stream::iter(0..8).then(|_| async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            Ok::<_, std::io::Error>(Bytes::from(vec![7; 64 * 1024]))
        });
        let (body, room) = budget.read("a", Body::from_stream(chunks)).await.unwrap();
        assert_eq!(body.len(), 8 * 64 * 1024);
        assert_eq!(budget.total.available_permits(), (1 << 20) - body.len());
        drop(room);
        assert_eq!(budget.total.available_permits(), 1 << 20);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_over_its_share_waits_and_others_do_not() {
        let budget = Arc::new(BodyBudget::new(1 << 20, 1 << 18));
        let (_held, room) = budget
            .read("a", whole(vec![Bytes::from(vec![0; 1 << 18])]))
            .await
            .unwrap();
        // Tenant a's part is full: its next body waits, then is refused.
        let waiting = tokio::spawn({
            let budget = budget.clone();
            async move { budget.read("a", whole(vec![Bytes::from_static(b"x")])).await.err() }
        });
        // Tenant b's is not.
        let (b, _b_room) = budget.read("b", whole(vec![Bytes::from_static(b"y")])).await.unwrap();
        assert_eq!(&b[..], b"y");
        assert_eq!(waiting.await.unwrap(), Some(BodyError::Busy));
        // Room given back is taken by the next body.
        drop(room);
        let (a, _) = budget.read("a", whole(vec![Bytes::from_static(b"x")])).await.unwrap();
        assert_eq!(&a[..], b"x");
    }

    #[tokio::test]
    async fn chunks_are_joined_and_the_limit_holds() {
        let budget = BodyBudget::new(BODIES_IN_MEMORY, TENANT_BODIES);
        let (body, _) = budget
            .read("a", whole(vec![Bytes::from_static(b"ab"), Bytes::from_static(b"cd")]))
            .await
            .unwrap();
        assert_eq!(&body[..], b"abcd");
        let over = vec![Bytes::from(vec![0; BODY_LIMIT]), Bytes::from_static(b"!")];
        assert_eq!(budget.read("a", whole(over)).await.err(), Some(BodyError::TooLong));
        assert_eq!(budget.total.available_permits(), BODIES_IN_MEMORY);
    }
}
