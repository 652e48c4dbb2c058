//! Field paths: parsing anything, and get/set/remove on what parses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sless_dataflow::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(path) = Path::parse(text) {
        let mut record = serde_json::json!({"a": {"b": [1, {"c": 2}]}, "d": null});
        let _ = path.get(&record);
        path.set(&mut record, serde_json::json!("x"));
        let _ = path.remove(&mut record);
        let _ = path.leaf_name();
    }
});
