//! The filter/router condition grammar: parsing anything and evaluating what
//! parses never panics nor overflows the stack.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sless_dataflow::condition::Condition;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(condition) = Condition::parse(text) {
        let record = serde_json::json!({"a": 1, "b": "x", "c": {"d": [true, null, 2.5]}, "e": ""});
        let _ = condition.eval(&record);
    }
});
