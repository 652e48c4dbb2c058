//! The engine link: how the gateway talks to a sless engine, on the
//! engine's own port beside HTTP/1.1. One connection per gateway serving
//! thread carries many requests at once, each frame naming its request, so
//! a request costs neither a pool checkout nor an HTTP parse on either side,
//! and the requests in flight share their socket writes.
//!
//! A connection opens with [`HELLO`] from the gateway, then the engine's
//! token (a u16 length and its bytes); the engine answers [`HELLO`], or
//! [`DENIED`] and closes the connection where the token is not its own. An HTTP
//! server answers the hello with an error instead (NUL starts no method,
//! and the blank line ends the request), which tells the gateway to speak
//! HTTP there, as to ElasticMQ. Then frames both ways, big-endian: a u32
//! length of what follows, the u32 id of the request, and
//! - a request: its method (u8 length), path and query (u16 length),
//!   headers and body;
//! - an answer: its status (u16), headers and body;
//!
//! where headers are a u8 count of names (u8 length) and values (u16
//! length), and the body is the frame's rest.
//!
//! An engine that stops closes its links without failing a request: it
//! sends a [`closing`] answer of id 0 (no request has it), answers each
//! request it reads after that with a [`closing`] answer of the request's
//! id and runs none, and closes once the gateway closed its side or after
//! a moment. A gateway sends nothing more on a link that is closing, and
//! sends the requests it had refused again on a new one.

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The first bytes of a link connection, both ways.
pub const HELLO: &[u8] = b"\0sless-engine-link/1\r\n\r\n";
/// The engine's answer to a hello without its token, as long as
/// [`HELLO`]; the engine closes the connection after it.
pub const DENIED: &[u8] = b"\0sless-engine-link/0\r\n\r\n";
/// The header of an engine's answer that it closes the link and ran
/// nothing of the request (see [`closing`]).
pub const CLOSING: &str = "x-sless-link-closing";
/// The request id of an engine's notice that it closes the link.
pub const NOTICE_ID: u32 = 0;
/// The header of an answer from a replica that another one leads (it
/// passed the request on): a gateway asks another replica first next time,
/// and so learns the leader. Never passed to clients.
pub const FOLLOWER: &str = "x-sless-follower";
/// An engine closes a link with nothing in flight that sends no frame for
/// this long. Gateways drop their idle links sooner
/// ([`crate::gateway::link`]), so they never send into one closing.
pub const IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Longest engine token a hello carries.
pub const MAX_TOKEN: usize = 256;
/// Longest request frame: the largest body either side accepts (8 MiB),
/// with room for the longest path and headers a frame carries.
pub const MAX_REQUEST: usize = 10 << 20;
/// Longest answer frame: ten messages of 1 MiB as the query protocol's
/// XML writes them (`&quot;` for `"`: up to six bytes a byte), with room
/// to spare. The engine's answers were never capped over HTTP.
pub const MAX_ANSWER: usize = 128 << 20;
/// Most headers a frame carries.
const MAX_HEADERS: usize = 16;
/// Where a frame's request id sits: after its length.
const ID_AT: std::ops::Range<usize> = 4..8;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("the connection ended inside a frame")]
    Truncated,
    #[error("a frame of {0} bytes is longer than this side takes")]
    TooLong(usize),
    #[error("the request's {0} is longer than the engine link carries")]
    FieldTooLong(&'static str),
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
    #[error("link i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// A request as the engine reads it.
#[derive(Debug)]
pub struct Request {
    pub id: u32,
    pub method: Method,
    /// The path with its query, as on an HTTP request line.
    pub target: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Request {
    pub fn path(&self) -> &str {
        self.target.split_once('?').map_or(&self.target, |(path, _)| path)
    }

    pub fn query(&self) -> Option<&str> {
        self.target.split_once('?').map(|(_, query)| query)
    }
}

/// An answer as the gateway reads it.
#[derive(Debug)]
pub struct Answer {
    pub id: u32,
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// An engine's answer that it closes the link and did not run request
/// `id` ([`NOTICE_ID`]: none), to be sent again on another link.
pub fn closing(id: u32) -> BytesMut {
    let header = (HeaderName::from_static(CLOSING), HeaderValue::from_static("1"));
    let headers = std::iter::once((&header.0, &header.1));
    // An empty answer with one short header always fits a frame.
    answer_frame(id, StatusCode::SERVICE_UNAVAILABLE, headers, b"").unwrap_or_default()
}

/// Whether `answer` is an engine's [`closing`] answer.
pub fn is_closing(answer: &Answer) -> bool {
    answer.headers.contains_key(CLOSING)
}

/// A request's frame, with id 0 until [`set_id`] gives it one; refused
/// where a part is longer than its length field holds, never cut short.
pub fn request_frame<'a>(
    method: &Method,
    target: &str,
    headers: impl Iterator<Item = (&'a str, &'a HeaderValue)> + Clone,
    body: &[u8],
) -> Result<BytesMut, FrameError> {
    let mut frame = BytesMut::with_capacity(
        12 + method.as_str().len()
            + target.len()
            + headers.clone().map(|(n, v)| 3 + n.len() + v.len()).sum::<usize>()
            + body.len(),
    );
    frame.put_u32(0);
    frame.put_u32(0);
    put_short(&mut frame, method.as_str().as_bytes(), "method")?;
    put_long(&mut frame, target.as_bytes(), "path and query")?;
    put_headers(&mut frame, headers)?;
    frame.put_slice(body);
    if frame.len() - 4 > MAX_REQUEST {
        return Err(FrameError::TooLong(frame.len() - 4));
    }
    Ok(seal(frame))
}

/// An answer's frame.
pub fn answer_frame<'a>(
    id: u32,
    status: StatusCode,
    headers: impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)>,
    body: &[u8],
) -> Result<BytesMut, FrameError> {
    let mut frame = BytesMut::with_capacity(256 + body.len());
    frame.put_u32(0);
    frame.put_u32(id);
    frame.put_u16(status.as_u16());
    put_headers(&mut frame, headers.map(|(n, v)| (n.as_str(), v)))?;
    frame.put_slice(body);
    if frame.len() - 4 > MAX_ANSWER {
        return Err(FrameError::TooLong(frame.len() - 4));
    }
    Ok(seal(frame))
}

/// Numbers a request's frame.
pub fn set_id(frame: &mut [u8], id: u32) {
    frame[ID_AT].copy_from_slice(&id.to_be_bytes());
}

/// Writes the frame's length in front of it (checked against the limits
/// before: it fits a u32).
fn seal(mut frame: BytesMut) -> BytesMut {
    let len = u32::try_from(frame.len() - 4).unwrap_or(u32::MAX);
    frame[..4].copy_from_slice(&len.to_be_bytes());
    frame
}

fn put_short(frame: &mut BytesMut, bytes: &[u8], what: &'static str) -> Result<(), FrameError> {
    let len = u8::try_from(bytes.len()).map_err(|_| FrameError::FieldTooLong(what))?;
    frame.put_u8(len);
    frame.put_slice(bytes);
    Ok(())
}

fn put_long(frame: &mut BytesMut, bytes: &[u8], what: &'static str) -> Result<(), FrameError> {
    let len = u16::try_from(bytes.len()).map_err(|_| FrameError::FieldTooLong(what))?;
    frame.put_u16(len);
    frame.put_slice(bytes);
    Ok(())
}

fn put_headers<'a>(
    frame: &mut BytesMut,
    headers: impl Iterator<Item = (&'a str, &'a HeaderValue)>,
) -> Result<(), FrameError> {
    let count_at = frame.len();
    frame.put_u8(0);
    let mut count = 0;
    for (name, value) in headers {
        count += 1;
        if count > MAX_HEADERS {
            return Err(FrameError::FieldTooLong("header list"));
        }
        put_short(frame, name.as_bytes(), "header name")?;
        put_long(frame, value.as_bytes(), "header value")?;
    }
    frame[count_at] = count as u8;
    Ok(())
}

/// Reads a request's frame (without its length).
pub fn read_request(mut frame: Bytes) -> Result<Request, FrameError> {
    let id = take_u32(&mut frame)?;
    let method = Method::from_bytes(&take_short(&mut frame)?).map_err(|_| FrameError::Malformed("method"))?;
    let target = String::from_utf8(take_long(&mut frame)?.to_vec()).map_err(|_| FrameError::Malformed("target"))?;
    let headers = take_headers(&mut frame)?;
    Ok(Request {
        id,
        method,
        target,
        headers,
        body: frame,
    })
}

/// Reads an answer's frame (without its length).
pub fn read_answer(mut frame: Bytes) -> Result<Answer, FrameError> {
    let id = take_u32(&mut frame)?;
    if frame.len() < 2 {
        return Err(FrameError::Malformed("status"));
    }
    let status = StatusCode::from_u16(frame.get_u16()).map_err(|_| FrameError::Malformed("status"))?;
    let headers = take_headers(&mut frame)?;
    Ok(Answer {
        id,
        status,
        headers,
        body: frame,
    })
}

fn take_u32(frame: &mut Bytes) -> Result<u32, FrameError> {
    if frame.len() < 4 {
        return Err(FrameError::Malformed("id"));
    }
    Ok(frame.get_u32())
}

fn take_short(frame: &mut Bytes) -> Result<Bytes, FrameError> {
    let len = usize::from(*frame.first().ok_or(FrameError::Malformed("length"))?);
    frame.advance(1);
    take(frame, len)
}

fn take_long(frame: &mut Bytes) -> Result<Bytes, FrameError> {
    if frame.len() < 2 {
        return Err(FrameError::Malformed("length"));
    }
    let len = usize::from(frame.get_u16());
    take(frame, len)
}

fn take(frame: &mut Bytes, len: usize) -> Result<Bytes, FrameError> {
    if frame.len() < len {
        return Err(FrameError::Malformed("length"));
    }
    Ok(frame.split_to(len))
}

fn take_headers(frame: &mut Bytes) -> Result<HeaderMap, FrameError> {
    let count = usize::from(*frame.first().ok_or(FrameError::Malformed("headers"))?);
    frame.advance(1);
    if count > MAX_HEADERS {
        return Err(FrameError::Malformed("too many headers"));
    }
    let mut headers = HeaderMap::with_capacity(count);
    for _ in 0..count {
        let name = HeaderName::from_bytes(&take_short(frame)?).map_err(|_| FrameError::Malformed("header name"))?;
        let value =
            HeaderValue::from_maybe_shared(take_long(frame)?).map_err(|_| FrameError::Malformed("header value"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// Most a frame reader asks of a read beyond what it holds.
const READ_AHEAD: usize = 64 * 1024;
/// What a frame reader asks of a read for a frame's length: the small
/// frames most requests and answers are come whole.
const FIRST_READ: usize = 8 * 1024;

/// Frames as they arrive on one connection.
pub struct FrameReader<R> {
    io: R,
    buffer: BytesMut,
    /// The longest frame taken: [`MAX_REQUEST`] or [`MAX_ANSWER`].
    limit: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(io: R, limit: usize) -> Self {
        Self {
            io,
            buffer: BytesMut::new(),
            limit,
        }
    }

    /// The next frame (without its length), or `None` where the peer
    /// closed the connection between two frames. Memory grows with the
    /// bytes that arrived, never with a length the peer only announced:
    /// a reader starts with nothing and reads at most [`READ_AHEAD`] more
    /// than it holds.
    pub async fn next(&mut self) -> Result<Option<Bytes>, FrameError> {
        loop {
            if self.buffer.len() >= 4 {
                let len = u32::from_be_bytes([self.buffer[0], self.buffer[1], self.buffer[2], self.buffer[3]]) as usize;
                if len > self.limit {
                    return Err(FrameError::TooLong(len));
                }
                if self.buffer.len() >= 4 + len {
                    self.buffer.advance(4);
                    return Ok(Some(self.buffer.split_to(len).freeze()));
                }
                let missing = 4 + len - self.buffer.len();
                self.buffer.reserve(missing.min(READ_AHEAD));
            } else {
                self.buffer.reserve(FIRST_READ);
            }
            if self.io.read_buf(&mut self.buffer).await? == 0 {
                return if self.buffer.is_empty() {
                    Ok(None)
                } else {
                    Err(FrameError::Truncated)
                };
            }
        }
    }
}

/// Writes what arrives on `items` as frames, gathered: whatever waits
/// there when a write starts goes out in that one write. `frame` turns an
/// item into its frame, or drops it.
pub async fn write_frames<W: tokio::io::AsyncWrite + Unpin, T>(
    mut io: W,
    items: &mut tokio::sync::mpsc::Receiver<T>,
    mut frame: impl FnMut(T) -> Option<BytesMut>,
) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    const GATHER: usize = 256 * 1024;
    // Grows with what is gathered: an idle link holds nothing.
    let mut batch = BytesMut::new();
    while let Some(first) = items.recv().await {
        let mut next = Some(first);
        while let Some(item) = next.take() {
            match frame(item) {
                // A large frame goes out as it is, not copied: what is
                // gathered before it first.
                Some(frame) if frame.len() >= GATHER => {
                    if !batch.is_empty() {
                        io.write_all(&batch).await?;
                        batch.clear();
                    }
                    io.write_all(&frame).await?;
                }
                Some(frame) => batch.extend_from_slice(&frame),
                None => {}
            }
            if batch.len() < GATHER {
                next = items.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            io.write_all(&batch).await?;
            batch.clear();
        }
        // A burst's buffer is not kept by an idle link.
        if batch.capacity() > 2 * GATHER {
            batch = BytesMut::new();
        }
    }
    io.shutdown().await
}

/// The gateway's hello: [`HELLO`], then the engine's token (a u16 length
/// and its bytes; tokens are at most [`MAX_TOKEN`] long).
pub fn hello_with(token: &[u8]) -> Vec<u8> {
    let token = &token[..token.len().min(MAX_TOKEN)];
    let mut hello = Vec::with_capacity(HELLO.len() + 2 + token.len());
    hello.extend_from_slice(HELLO);
    hello.extend_from_slice(&(token.len() as u16).to_be_bytes());
    hello.extend_from_slice(token);
    hello
}

/// The token after the gateway's hello ([`hello_with`]), or `None` for
/// anything else.
pub async fn read_hello_with<R: AsyncRead + Unpin>(io: &mut R) -> std::io::Result<Option<Vec<u8>>> {
    if read_hello(io).await? != Greeting::Hello {
        return Ok(None);
    }
    let len = usize::from(io.read_u16().await?);
    if len > MAX_TOKEN {
        return Ok(None);
    }
    let mut token = vec![0; len];
    io.read_exact(&mut token).await?;
    Ok(Some(token))
}

/// What a peer opens a link connection with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Greeting {
    Hello,
    /// The engine's refusal of the token.
    Denied,
    /// Anything else: not a link peer.
    Other,
}

/// Reads the peer's greeting: [`HELLO`], [`DENIED`] or anything else.
pub async fn read_hello<R: AsyncRead + Unpin>(io: &mut R) -> Result<Greeting, std::io::Error> {
    const _: () = assert!(HELLO.len() == DENIED.len());
    let mut hello = [0u8; HELLO.len()];
    match io.read_exact(&mut hello).await {
        Ok(_) if hello == HELLO => Ok(Greeting::Hello),
        Ok(_) if hello == DENIED => Ok(Greeting::Denied),
        Ok(_) => Ok(Greeting::Other),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(Greeting::Other),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_back_as_written() {
        let json = HeaderValue::from_static("application/x-amz-json-1.0");
        let target = HeaderValue::from_static("AmazonSQS.SendMessage");
        let headers = [("content-type", &json), ("x-amz-target", &target)];
        let mut frame = request_frame(&Method::POST, "/000000000042/jobs?a=b", headers.into_iter(), b"{}").unwrap();
        set_id(&mut frame, 7);
        let request = read_request(frame.freeze().slice(4..)).unwrap();
        assert_eq!(request.id, 7);
        assert_eq!(request.method, Method::POST);
        assert_eq!(request.path(), "/000000000042/jobs");
        assert_eq!(request.query(), Some("a=b"));
        assert_eq!(request.headers["x-amz-target"], "AmazonSQS.SendMessage");
        assert_eq!(&request.body[..], b"{}");

        let mut answer_headers = HeaderMap::new();
        answer_headers.insert("x-amzn-requestid", HeaderValue::from_static("abc"));
        let frame = answer_frame(9, StatusCode::BAD_REQUEST, answer_headers.iter(), b"no").unwrap();
        let answer = read_answer(frame.freeze().slice(4..)).unwrap();
        assert_eq!((answer.id, answer.status), (9, StatusCode::BAD_REQUEST));
        assert_eq!(answer.headers["x-amzn-requestid"], "abc");
        assert_eq!(&answer.body[..], b"no");
    }

    #[test]
    fn malformed_frames_are_errors_not_panics() {
        let mut whole = request_frame(&Method::POST, "/q", std::iter::empty(), b"body")
            .unwrap()
            .freeze();
        whole.advance(4);
        // Every cut short of the body's start is malformed.
        for cut in 0..whole.len() - 4 {
            assert!(read_request(whole.slice(..cut)).is_err(), "{cut}");
        }
        assert!(read_request(Bytes::from_static(b"\0\0\0\x01\x03BAD\0\0\x11")).is_err());
        assert!(read_request(Bytes::from_static(b"\0\0\0\x01\x04P\nST\0\0\0")).is_err());
        assert!(read_answer(Bytes::from_static(b"\0\0\0\x01\0\x05\0")).is_err());
        assert!(read_answer(Bytes::from_static(b"\0\0\0\x01\x00\xc8\x01\x01\n\0\x01a")).is_err());
    }

    #[test]
    fn a_part_too_long_for_its_length_is_refused_not_cut_short() {
        let long = "q".repeat(usize::from(u16::MAX) + 1);
        let target = format!("/?{long}");
        let e = request_frame(&Method::GET, &target, std::iter::empty(), b"").unwrap_err();
        assert!(matches!(e, FrameError::FieldTooLong("path and query")), "{e}");
        let value = HeaderValue::from_str(&long).unwrap();
        let e = request_frame(&Method::POST, "/", [("user-agent", &value)].into_iter(), b"").unwrap_err();
        assert!(matches!(e, FrameError::FieldTooLong("header value")), "{e}");
        let e = request_frame(&Method::POST, "/", std::iter::empty(), &vec![0; MAX_REQUEST]).unwrap_err();
        assert!(matches!(e, FrameError::TooLong(_)), "{e}");
        // At the longest a field holds, it goes whole.
        let target = format!("/?{}", "q".repeat(usize::from(u16::MAX) - 2));
        let frame = request_frame(&Method::GET, &target, std::iter::empty(), b"").unwrap();
        assert_eq!(read_request(frame.freeze().slice(4..)).unwrap().target, target);
    }

    #[tokio::test]
    async fn a_reader_refuses_a_long_frame_before_reading_it() {
        let announced = u32::try_from(MAX_REQUEST + 1).unwrap().to_be_bytes();
        let mut reader = FrameReader::new(&announced[..], MAX_REQUEST);
        assert!(matches!(reader.next().await, Err(FrameError::TooLong(_))));
        // Cut inside a frame; and a clean end between frames.
        let mut reader = FrameReader::new(&b"\0\0\0\x09abc"[..], MAX_REQUEST);
        assert!(matches!(reader.next().await, Err(FrameError::Truncated)));
        let mut reader = FrameReader::new(&b"\0\0\0\x02ab"[..], MAX_REQUEST);
        assert_eq!(&reader.next().await.unwrap().unwrap()[..], b"ab");
        assert!(reader.next().await.unwrap().is_none());
    }
}
