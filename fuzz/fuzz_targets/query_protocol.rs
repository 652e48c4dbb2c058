//! The SQS query protocol's form decoding, and the engine's answer to
//! whatever decodes, in both protocols.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use sless_sqs::engine::{Engine, EngineConfig};
use sless_sqs::protocol::{self, Protocol};

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime")
});

fuzz_target!(|data: &[u8]| {
    let body = bytes::Bytes::copy_from_slice(data);
    let Ok(decoded) = protocol::query::decode(None, &body) else {
        return;
    };
    let engine = Engine::in_memory(
        EngineConfig {
            account_id: "acme".into(),
            region: "ru-msk-1".into(),
            base_url: "http://engine".into(),
        });
    // Long polls are cut short: the fuzzer wants answers, not waits.
    let result = RUNTIME.block_on(async {
        tokio::time::timeout(std::time::Duration::from_millis(50), engine.handle(&decoded.action, &decoded.input))
            .await
    });
    if let Ok(result) = result {
        let _ = protocol::respond(Protocol::Query, &decoded.action, result, "id");
    }
});
