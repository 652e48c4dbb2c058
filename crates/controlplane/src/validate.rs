//! Input bounds of seed 002 §4 and §7. Every check runs before the store is
//! touched; messages name the field, never echo free text.

use std::collections::HashSet;

use super::model::{Checksum, ProxyCounters};

pub const MAX_ID_LEN: usize = 128;
pub const MAX_LABELS: usize = 32;
pub const MAX_LABEL_KEY: usize = 64;
pub const MAX_LABEL_VALUE: usize = 256;
pub const MAX_LABELS_TOTAL: usize = 4096;
pub const MAX_ERROR_CODE: usize = 64;
pub const MAX_ERROR_MESSAGE: usize = 512;
/// Sequences, versions and epochs pass through Redis Lua, whose numbers are
/// doubles: above 2^53 they would compare wrongly.
pub const MAX_COUNTER_VALUE: u64 = 1 << 53;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct Invalid {
    pub field: &'static str,
    pub reason: String,
}

fn invalid(field: &'static str, reason: impl Into<String>) -> Invalid {
    Invalid {
        field,
        reason: reason.into(),
    }
}

/// `[A-Za-z0-9][A-Za-z0-9._-]{0,127}`
pub fn id(value: &str, field: &'static str) -> Result<(), Invalid> {
    let bytes = value.as_bytes();
    let Some(first) = bytes.first() else {
        return Err(invalid(field, "is required"));
    };
    if bytes.len() > MAX_ID_LEN {
        return Err(invalid(field, format!("is longer than {MAX_ID_LEN} bytes")));
    }
    if !first.is_ascii_alphanumeric()
        || !bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(invalid(field, "must match [A-Za-z0-9][A-Za-z0-9._-]{0,127}"));
    }
    Ok(())
}

pub fn zone(value: &str) -> Result<(), Invalid> {
    if value.is_empty() { Ok(()) } else { id(value, "zone") }
}

pub fn labels(labels: &[(String, String)]) -> Result<(), Invalid> {
    if labels.len() > MAX_LABELS {
        return Err(invalid("labels", format!("more than {MAX_LABELS} labels")));
    }
    let mut seen = HashSet::new();
    let mut total = 0;
    for (key, value) in labels {
        if key.is_empty() {
            return Err(invalid("labels", "empty key"));
        }
        if key.len() > MAX_LABEL_KEY {
            return Err(invalid("labels", format!("a key is longer than {MAX_LABEL_KEY} bytes")));
        }
        if value.len() > MAX_LABEL_VALUE {
            return Err(invalid(
                "labels",
                format!("a value is longer than {MAX_LABEL_VALUE} bytes"),
            ));
        }
        if key.trim() != key || value.trim() != value {
            return Err(invalid(
                "labels",
                "keys and values must not have surrounding whitespace",
            ));
        }
        if !seen.insert(key.as_str()) {
            return Err(invalid("labels", format!("duplicate key {key:?}")));
        }
        total += key.len() + value.len();
    }
    if total > MAX_LABELS_TOTAL {
        return Err(invalid("labels", format!("more than {MAX_LABELS_TOTAL} bytes in all")));
    }
    Ok(())
}

/// Exactly 32 raw bytes: hex text or another length is refused.
pub fn checksum(bytes: &[u8]) -> Result<Checksum, Invalid> {
    bytes
        .try_into()
        .map_err(|_| invalid("checksum", format!("must be 32 raw bytes, got {}", bytes.len())))
}

/// Empty, or `[A-Z][A-Z0-9_]{0,63}`.
pub fn error_code(code: &str) -> Result<(), Invalid> {
    let bytes = code.as_bytes();
    match bytes.first() {
        None => Ok(()),
        Some(first)
            if first.is_ascii_uppercase()
                && bytes.len() <= MAX_ERROR_CODE
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_') =>
        {
            Ok(())
        }
        Some(_) => Err(invalid("error_code", "must match [A-Z][A-Z0-9_]{0,63}")),
    }
}

/// Only the length is checked; the text itself is dropped unread.
pub fn error_message(message: &str) -> Result<(), Invalid> {
    if message.len() > MAX_ERROR_MESSAGE {
        return Err(invalid(
            "error_message",
            format!("longer than {MAX_ERROR_MESSAGE} bytes"),
        ));
    }
    Ok(())
}

pub fn bounded(value: u64, field: &'static str) -> Result<(), Invalid> {
    if value > MAX_COUNTER_VALUE {
        return Err(invalid(field, "is larger than 2^53"));
    }
    Ok(())
}

/// Non-negative counters with unique, well-formed proxy ids; sorts them.
pub fn counters(counters: &mut [ProxyCounters], max: usize) -> Result<(), Invalid> {
    if counters.len() > max {
        return Err(invalid("counters", format!("more than {max} entries")));
    }
    for c in counters.iter() {
        id(&c.proxy_id, "proxy_id")?;
        if [c.requests, c.errors, c.in_flight, c.bytes_in, c.bytes_out]
            .iter()
            .any(|v| *v < 0)
        {
            return Err(invalid(
                "counters",
                format!("negative counter for proxy {:?}", c.proxy_id),
            ));
        }
    }
    counters.sort_by(|a, b| a.proxy_id.cmp(&b.proxy_id));
    if let Some(pair) = counters.windows(2).find(|w| w[0].proxy_id == w[1].proxy_id) {
        return Err(invalid(
            "counters",
            format!("duplicate proxy id {:?}", pair[0].proxy_id),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        for ok in ["a", "A.b_c-9", &"x".repeat(128)] {
            assert!(id(ok, "worker_id").is_ok(), "{ok}");
        }
        for bad in ["", ".a", "-a", "a b", "a/b", "é", &"x".repeat(129)] {
            assert_eq!(id(bad, "worker_id").unwrap_err().field, "worker_id", "{bad}");
        }
        assert!(zone("").is_ok());
        assert!(zone(" z").is_err());
    }

    fn l(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn label_bounds() {
        assert!(labels(&l(&[("a", "1"), ("b", "")])).is_ok());
        assert!(labels(&l(&[("a", "1"), ("a", "2")])).is_err(), "duplicate");
        assert!(labels(&l(&[("", "1")])).is_err(), "empty key");
        assert!(labels(&l(&[(" a", "1")])).is_err(), "whitespace key");
        assert!(labels(&l(&[("a", "1 ")])).is_err(), "whitespace value");
        assert!(labels(&l(&[(&"k".repeat(65), "1")])).is_err());
        assert!(labels(&l(&[("k", &"v".repeat(257))])).is_err());
        let many: Vec<_> = (0..33).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(labels(&many).is_err(), "33 labels");
        // 17 labels of 64+256 bytes: within count and per-field bounds, over 4 KiB.
        let big: Vec<_> = (0..17).map(|i| (format!("{i:0>64}"), "v".repeat(256))).collect();
        assert!(labels(&big).unwrap_err().reason.contains("4096"));
    }

    #[test]
    fn checksum_codes_and_messages() {
        assert!(checksum(&[0; 32]).is_ok());
        assert!(checksum(&[0; 31]).is_err());
        assert!(checksum(&[b'a'; 64]).is_err(), "hex text is not raw bytes");
        for ok in ["", "E", "BAD_SNAPSHOT_2"] {
            assert!(error_code(ok).is_ok(), "{ok}");
        }
        for bad in ["e", "1E", "BAD-CODE", &format!("E{}", "X".repeat(64))] {
            assert!(error_code(bad).is_err(), "{bad}");
        }
        assert!(error_message(&"m".repeat(512)).is_ok());
        assert!(error_message(&"m".repeat(513)).is_err());
    }

    fn counter(id: &str, requests: i64) -> ProxyCounters {
        ProxyCounters {
            proxy_id: id.into(),
            requests,
            errors: 0,
            in_flight: 0,
            bytes_in: 0,
            bytes_out: 0,
        }
    }

    #[test]
    fn counter_rules() {
        let mut ok = vec![counter("b", 1), counter("a", 0)];
        counters(&mut ok, 10).unwrap();
        assert_eq!(ok[0].proxy_id, "a", "sorted");
        assert!(counters(&mut [counter("a", -1)], 10).is_err());
        assert!(counters(&mut [counter("a", 1), counter("a", 2)], 10).is_err());
        assert!(counters(&mut [counter("a", 1), counter("b", 2)], 1).is_err());
        assert!(counters(&mut [counter("bad id", 1)], 10).is_err());
    }
}
