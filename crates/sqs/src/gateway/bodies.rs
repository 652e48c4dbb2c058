//! Room for request bodies in the gateway's memory. A body is read before
//! its signature can be checked (SigV4 signs the payload's hash), so a
//! client that knows only an access key id (key ids are not secrets) must
//! not be able to hold room that other requests need:
//!
//! - room is taken for the memory a body holds as its bytes arrive (one
//!   buffer, grown by doubling, its capacity counted), never for a declared
//!   length;
//! - each tenant (named by the key id) holds at most its share, so a key id
//!   can crowd out only its own tenant's requests;
//! - a part of the room is kept for tenants whose bodies hold little, so
//!   that even clients knowing several tenants' key ids, each filling its
//!   share, cannot keep out another tenant's small requests;
//! - a body must keep arriving at [`MIN_RATE`] after a short grace, so a
//!   stalled upload gives its room back within seconds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
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
/// The part of [`BODIES_IN_MEMORY`] kept for tenants whose bodies hold
/// little (a 64th of a share, 1 MiB): four tenants' shares fill the rest,
/// not this.
pub const RESERVED: usize = 64 << 20;
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
    /// Room any tenant may take.
    shared: Arc<Semaphore>,
    /// Room only a tenant holding little (a 64th of its share) may take.
    reserved: Arc<Semaphore>,
    share: usize,
    tenants: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// The room one body holds, given back when it drops.
#[derive(Default)]
pub struct Room {
    tenant: Option<OwnedSemaphorePermit>,
    shared: Option<OwnedSemaphorePermit>,
    reserved: Option<OwnedSemaphorePermit>,
}

/// Adds `permit` to what `held` holds of its semaphore.
fn keep(held: &mut Option<OwnedSemaphorePermit>, permit: OwnedSemaphorePermit) {
    match held {
        Some(held) => held.merge(permit),
        None => *held = Some(permit),
    }
}

impl Room {
    fn holds(&self) -> bool {
        self.tenant.is_some()
    }
}

impl BodyBudget {
    /// `total` bytes, of which [`RESERVED`] (at most half) only for
    /// tenants that hold little, and at most `share` for one tenant.
    pub fn new(total: usize, share: usize) -> Self {
        let reserved = RESERVED.min(total / 2);
        Self {
            shared: Arc::new(Semaphore::new(total - reserved)),
            reserved: Arc::new(Semaphore::new(reserved)),
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
    /// holding shared room; then the shared room, or for a tenant that
    /// holds little the reserved room, or else the shared room once some
    /// is given back.
    async fn take(&self, tenant: &Arc<Semaphore>, room: &mut Room, bytes: usize) -> Result<(), BodyError> {
        let Ok(n) = u32::try_from(bytes) else {
            return Err(BodyError::TooLong);
        };
        if n == 0 {
            return Ok(());
        }
        let deadline = Instant::now() + if room.holds() { HOLDING_WAIT } else { ROOM_TIMEOUT };
        let light = self.share - tenant.available_permits() + bytes <= self.share / 64;
        let mine = tokio::time::timeout_at(deadline, tenant.clone().acquire_many_owned(n))
            .await
            .map_err(|_| BodyError::Busy)?
            .map_err(|_| BodyError::Busy)?;
        keep(&mut room.tenant, mine);
        if let Ok(shared) = self.shared.clone().try_acquire_many_owned(n) {
            keep(&mut room.shared, shared);
            return Ok(());
        }
        if light && let Ok(reserved) = self.reserved.clone().try_acquire_many_owned(n) {
            keep(&mut room.reserved, reserved);
            return Ok(());
        }
        let shared = tokio::time::timeout_at(deadline, self.shared.clone().acquire_many_owned(n))
            .await
            .map_err(|_| BodyError::Busy)?
            .map_err(|_| BodyError::Busy)?;
        keep(&mut room.shared, shared);
        Ok(())
    }

    /// Reads `body` of `tenant`'s request whole into one buffer, taking
    /// room for its capacity as it grows; the room is held until the
    /// [`Room`] drops. Each frame is copied in and let go at once, so what
    /// a body holds is its buffer, however it was cut into frames.
    pub async fn read(&self, tenant: &str, body: Body) -> Result<(Bytes, Room), BodyError> {
        let part = self.part(tenant);
        let mut room = Room::default();
        let mut whole: Vec<u8> = Vec::new();
        let mut body = std::pin::pin!(body);
        // Time spent waiting for room is not the client's.
        let mut started = Instant::now();
        loop {
            let due = started + GRACE + Duration::from_secs_f64(whole.len() as f64 / MIN_RATE as f64);
            let frame = match tokio::time::timeout_at(due, body.frame()).await {
                Err(_) => return Err(BodyError::TooSlow),
                Ok(None) => break,
                Ok(Some(Err(_))) => return Err(BodyError::Broken),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else { continue };
            let needed = whole.len() + data.len();
            if needed > BODY_LIMIT {
                return Err(BodyError::TooLong);
            }
            if needed > whole.capacity() {
                let grown = needed.max(whole.capacity() * 2).min(BODY_LIMIT);
                let waiting = Instant::now();
                self.take(&part, &mut room, grown - whole.capacity()).await?;
                started += waiting.elapsed();
                whole.reserve_exact(grown - whole.len());
            }
            whole.extend_from_slice(&data);
        }
        Ok((Bytes::from(whole), room))
    }
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

    fn free(budget: &BodyBudget) -> usize {
        budget.shared.available_permits() + budget.reserved.available_permits()
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
        assert_eq!(budget.shared.available_permits(), (1 << 19) - 1024);
        let started = Instant::now();
        assert_eq!(reading.await.unwrap(), Some(BodyError::TooSlow));
        // 1 KiB at 64 KiB/s buys 1/64 s beyond the grace.
        assert!(started.elapsed() < GRACE, "{:?}", started.elapsed());
        assert_eq!(budget.shared.available_permits(), 1 << 19, "the room is back");
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
        // The buffer doubled from 64 KiB to 512 KiB: what it holds is counted.
        assert_eq!(free(&budget), (1 << 20) - body.len());
        drop(room);
        assert_eq!(free(&budget), 1 << 20);
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
        assert_eq!(free(&budget), BODIES_IN_MEMORY);
    }

    /// A body cut into a million 8-byte frames holds its one buffer.
    #[tokio::test]
    async fn tiny_frames_make_one_buffer() {
        let budget = BodyBudget::new(BODIES_IN_MEMORY, TENANT_BODIES);
        let frames: Vec<Bytes> = (0..1_000_000u64)
            .map(|i| Bytes::from(i.to_le_bytes().to_vec()))
            .collect();
        let (body, room) = budget.read("a", whole(frames)).await.unwrap();
        assert_eq!(body.len(), 8_000_000);
        assert_eq!(&body[8..16], &1u64.to_le_bytes());
        assert!(BODIES_IN_MEMORY - free(&budget) <= 2 * 8_000_000);
        drop(room);
    }

    /// Tenants that fill their shares until the shared room is gone (a
    /// client knowing several key ids) keep out neither a tenant's small
    /// request nor, once they give back, anyone; a tenant sending much
    /// waits for the shared room, never takes the reserved one.
    #[tokio::test(start_paused = true)]
    async fn the_reserved_room_keeps_small_requests_going_when_shares_fill_the_rest() {
        let budget = Arc::new(BodyBudget::new(1 << 20, 1 << 18));
        let mut held = Vec::new();
        for tenant in ["a", "b"] {
            held.push(
                budget
                    .read(tenant, whole(vec![Bytes::from(vec![0; 1 << 18])]))
                    .await
                    .unwrap(),
            );
        }
        assert_eq!(budget.shared.available_permits(), 0, "the shared room is full");
        let (small, _) = budget
            .read("c", whole(vec![Bytes::from_static(b"send")]))
            .await
            .unwrap();
        assert_eq!(&small[..], b"send");
        let heavy = budget
            .read("d", whole(vec![Bytes::from(vec![0; 100 << 10])]))
            .await
            .err();
        assert_eq!(heavy, Some(BodyError::Busy));
        held.clear();
        assert!(
            budget
                .read("d", whole(vec![Bytes::from(vec![0; 100 << 10])]))
                .await
                .is_ok()
        );
    }
}
