//! REST request bodies: a queue service or a dataflow from any bytes,
//! deserialised and validated as the API does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sless_model::dataflow::DataFlowRequest;
use sless_model::queue_service::{QueueServiceRequest, QueueServiceSpec};

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = serde_json::from_slice::<DataFlowRequest>(data) {
        let _ = request.into_spec(&sless_dataflow::registry::Registry);
    }
    if let Ok(request) = serde_json::from_slice::<QueueServiceRequest>(data)
        && let Ok(spec) = request.spec_over(QueueServiceSpec::default())
    {
        let _ = spec.check_update_from(&QueueServiceSpec::default());
    }
});
