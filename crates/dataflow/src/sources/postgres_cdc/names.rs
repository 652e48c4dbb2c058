//! The names a `postgresql-cdc` source uses on the server and the marks
//! that say what is its own: the slot and publication names (a spec's
//! must begin with its tenant's prefix), and the comment on the
//! publication a dataflow made, which also says whether its snapshot is
//! still pending.

use sha2::{Digest, Sha256};

use super::PostgresCdcConfig;
use crate::ConnectorError;

/// The comment's words, after the owner's mark, while a snapshot is not
/// yet wholly written.
const SNAPSHOT_PENDING: &str = "snapshot pending";

/// A slot or publication name PostgreSQL accepts: `[a-z0-9_]{1,63}`.
pub(super) fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn hex_digest(text: &str, bytes: usize) -> String {
    sless_runtime::hex::encode(&Sha256::digest(text.as_bytes())[..bytes])
}

/// What a slot or publication name a spec gives must begin with: `sless_`,
/// 12 hex digits of the SHA-256 of `tenant`, and `_`. (The default names,
/// `sless_` and 20 hex digits, cannot begin so.)
pub fn name_prefix(tenant: &str) -> String {
    format!("sless_{}_", hex_digest(tenant, 6))
}

/// The slot and publication names of a dataflow, and whether they are its
/// defaults.
pub(super) fn names(config: &PostgresCdcConfig, id: &str) -> (String, String) {
    let slot = config
        .slot_name
        .clone()
        .unwrap_or_else(|| format!("sless_{}", hex_digest(id, 10)));
    let publication = config.publication_name.clone().unwrap_or_else(|| slot.clone());
    (slot, publication)
}

/// The comment a dataflow puts on the publication it makes (letters, digits
/// and spaces: a literal as it is).
fn owner_mark(id: &str) -> String {
    format!("made by sless dataflow {}", hex_digest(id, 8))
}

/// What the comment on a dataflow's publication says: `None` when this
/// dataflow did not make it; else whether a snapshot is pending. Unmarked
/// (made before marks), it is this dataflow's when it has the dataflow's
/// default name, which only this dataflow derives.
pub(super) fn owned(config: &PostgresCdcConfig, id: &str, comment: Option<&str>) -> Option<bool> {
    let mark = owner_mark(id);
    match comment {
        Some(c) if c == mark => Some(false),
        Some(c) if c.strip_prefix(mark.as_str()).and_then(|rest| rest.strip_prefix("; ")) == Some(SNAPSHOT_PENDING) => {
            Some(true)
        }
        Some(_) => None,
        None => (config.publication_name.is_none() && config.slot_name.is_none()).then_some(false),
    }
}

/// The comment a dataflow puts on its publication: its mark, and whether a
/// snapshot is pending (letters, digits, spaces and `;`: a literal as it is).
pub(super) fn comment(id: &str, pending: bool) -> String {
    match pending {
        true => format!("{}; {SNAPSHOT_PENDING}", owner_mark(id)),
        false => owner_mark(id),
    }
}

/// The comment on `publication`: `None` when there is no such publication.
pub(super) async fn publication_comment(
    client: &tokio_postgres::Client,
    publication: &str,
) -> Result<Option<Option<String>>, ConnectorError> {
    Ok(client
        .query_opt(
            "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(ConnectorError::query)?
        .map(|row| row.get::<_, Option<String>>(0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::postgres_cdc::SnapshotMode;

    #[test]
    fn only_this_dataflows_marks_are_its_own() {
        let config: PostgresCdcConfig = serde_json::from_value(serde_json::json!({"table": "t"})).unwrap();
        let named: PostgresCdcConfig =
            serde_json::from_value(serde_json::json!({"table": "t", "publicationName": "p"})).unwrap();
        assert_eq!(owned(&config, "a/f", Some(&comment("a/f", false))), Some(false));
        assert_eq!(owned(&config, "a/f", Some(&comment("a/f", true))), Some(true));
        assert_eq!(owned(&config, "a/g", Some(&comment("a/f", true))), None);
        assert_eq!(owned(&config, "a/f", Some("made by someone")), None);
        assert_eq!(
            owned(&config, "a/f", None),
            Some(false),
            "unmarked with the default name"
        );
        assert_eq!(owned(&named, "a/f", None), None, "unmarked with a name a spec gave");
        let snapshot: PostgresCdcConfig =
            serde_json::from_value(serde_json::json!({"table": "t", "snapshot": "initial_only"})).unwrap();
        assert_eq!(snapshot.snapshot, SnapshotMode::InitialOnly);
        assert!(
            serde_json::from_value::<PostgresCdcConfig>(serde_json::json!({"table": "t", "snapshot": "always"}))
                .is_err()
        );
    }

    #[test]
    fn default_names_are_valid_and_differ_by_dataflow() {
        let config: PostgresCdcConfig = serde_json::from_value(serde_json::json!({"table": "t"})).unwrap();
        let (a, pa) = names(&config, "a/flow");
        let (b, _) = names(&config, "b/flow");
        assert!(valid_name(&a) && valid_name(&b) && a != b);
        assert_eq!(a, pa);
        assert!(!valid_name("Bad-Name") && !valid_name("") && !valid_name(&"x".repeat(64)));
    }
}
