//! The engine link's decoders on whatever a peer sends: the hello and its
//! token, frames as a reader takes them off a connection (a length over the
//! limit, a frame cut short), and requests and answers read from each
//! frame. None may panic; what they accept must read back the same when
//! written again.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use sless_sqs::link::{self, FrameReader};

static RUNTIME: LazyLock<tokio::runtime::Runtime> =
    LazyLock::new(|| tokio::runtime::Builder::new_current_thread().build().expect("a runtime"));

fuzz_target!(|data: &[u8]| {
    RUNTIME.block_on(async {
        let mut hello = data;
        let _ = link::read_hello_with(&mut hello).await;
        // A small limit reaches the too-long branch with short inputs.
        for limit in [64, link::MAX_REQUEST] {
            let mut frames = FrameReader::new(data, limit);
            while let Ok(Some(frame)) = frames.next().await {
                if let Ok(request) = link::read_request(frame.clone()) {
                    let headers: Vec<_> = request.headers.iter().map(|(n, v)| (n.as_str(), v)).collect();
                    let headers = headers.iter().copied();
                    let mut again = link::request_frame(&request.method, &request.target, headers, &request.body)
                        .expect("what was read can be written");
                    link::set_id(&mut again, request.id);
                    let back = link::read_request(again.freeze().slice(4..)).expect("what was written reads");
                    assert_eq!((back.id, &back.target, &back.body), (request.id, &request.target, &request.body));
                }
                let _ = link::read_answer(frame);
            }
        }
    });
});
