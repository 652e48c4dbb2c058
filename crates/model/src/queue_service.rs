//! QueueService: one tenant's managed SQS-compatible endpoint (seed 000).

use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{FieldError, ValidationErrors};

pub const MEMORY_MB: RangeInclusive<i64> = 32..=1024;
pub const STORAGE_MB: RangeInclusive<i64> = 128..=10240;
pub const DEFAULT_MEMORY_MB: u32 = 64;
pub const DEFAULT_STORAGE_MB: u32 = 512;
/// How many replicas a queue service's engine may run as: one, or three
/// that keep the queues together and fail over when one is lost.
pub const REPLICAS: [u8; 2] = [1, 3];
/// SQS requests a second a queue service may ask that its tenant be let
/// through each gateway.
pub const REQUESTS_PER_SECOND: RangeInclusive<i64> = 1..=100_000;
/// Request bytes a second likewise: at least one largest message (1 MiB,
/// SQS's) a second, at most 1 GiB.
pub const BYTES_PER_SECOND: RangeInclusive<i64> = 1_048_576..=1_073_741_824;

/// The validated desired state of a queue service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueServiceSpec {
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "storageMB")]
    pub storage_mb: u32,
    pub persistence: bool,
    /// Records stored before this field existed are `disk`, as they were.
    #[serde(default)]
    pub durability: Durability,
    /// Records stored before this field existed ran one engine, as they do.
    #[serde(default = "one")]
    pub replicas: u8,
    /// Requests a second the tenant may make through each gateway; `None`:
    /// the platform's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_second: Option<u32>,
    /// Request bytes a second likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<u64>,
}

fn one() -> u8 {
    1
}

impl Default for QueueServiceSpec {
    fn default() -> Self {
        Self {
            memory_mb: DEFAULT_MEMORY_MB,
            storage_mb: DEFAULT_STORAGE_MB,
            persistence: true,
            durability: Durability::Disk,
            replicas: 1,
            requests_per_second: None,
            bytes_per_second: None,
        }
    }
}

/// When the queue engine acknowledges a change that persistence keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// After it is written to the journal and synced to disk (`fdatasync`):
    /// an acknowledged message survives a crash of the machine.
    #[default]
    Disk,
    /// After it is written to the journal, which is synced at most
    /// [`PROCESS_SYNC_MS`] later: an acknowledged message survives a crash
    /// of the engine; a crash of the machine can lose the last
    /// [`PROCESS_SYNC_MS`] of them.
    Process,
}

/// How long `process` durability lets written changes wait for their sync.
pub const PROCESS_SYNC_MS: u64 = 100;

impl Durability {
    pub const ALL: [Self; 2] = [Self::Disk, Self::Process];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disk => "disk",
            Self::Process => "process",
        }
    }
}

impl std::str::FromStr for Durability {
    type Err = FieldError;

    fn from_str(s: &str) -> Result<Self, FieldError> {
        Self::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| FieldError::not_supported("durability", s, &Self::ALL.map(Self::as_str)))
    }
}

/// Request body of `POST /queue-services`, and of `PUT`/`PATCH` where
/// `name` is optional and absent fields take defaults (PUT) or keep their
/// value (PATCH).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QueueServiceRequest {
    /// DNS label, 1–63 characters. Required on create; on update it must match the path.
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", max_length = 63)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Memory limit of the queue engine in MiB, 32–1024. Default 64.
    #[serde(
        rename = "memoryMB",
        default,
        deserialize_with = "crate::whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 32, maximum = 1024)]
    pub memory_mb: Option<i64>,
    /// Size of the message store volume in MiB, 128–10240. Default 512. Can only grow.
    #[serde(
        rename = "storageMB",
        default,
        deserialize_with = "crate::whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 128, maximum = 10240)]
    pub storage_mb: Option<i64>,
    /// Keep messages on disk across restarts. Default true. Cannot change after create.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistence: Option<bool>,
    /// When a change is acknowledged, with persistence on: `disk` (default)
    /// once it is synced to disk, surviving a crash of the machine; `process`
    /// once it is written to the journal, surviving a crash of the queue
    /// engine, synced within 100 ms. Changes in place (the engine restarts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub durability: Option<Durability>,
    /// How many replicas of the queue engine keep the queues: 1, or 3 (with
    /// persistence), which acknowledge a change once two of them hold it at
    /// the durability asked and go on serving when one is lost. Default:
    /// the platform's (1 in `sless dev` unless `--replicas 3`; 3 on
    /// Kubernetes with persistence). Changes in place, keeping every
    /// message: from 1 to 3 and back in `sless dev`, from 1 to 3 on
    /// Kubernetes.
    #[serde(
        default,
        deserialize_with = "crate::whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 1, maximum = 3)]
    pub replicas: Option<i64>,
    /// SQS requests a second the tenant may make through each gateway
    /// (a burst of one second's worth), 1–100000; over it a call is
    /// answered `RequestThrottled`, which the AWS SDKs retry. Absent: the
    /// platform's default (none in `sless dev` unless
    /// `--tenant-requests-per-second`; 2000 in `deploy/`). Changes in place.
    #[serde(
        rename = "requestsPerSecond",
        default,
        deserialize_with = "crate::whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 1, maximum = 100000)]
    pub requests_per_second: Option<i64>,
    /// Request body bytes a second the tenant may send through each
    /// gateway, 1048576 (one largest message) to 1073741824. Absent: the
    /// platform's default (none in `sless dev` unless
    /// `--tenant-bytes-per-second`; 64 MiB in `deploy/`). Changes in place.
    #[serde(
        rename = "bytesPerSecond",
        default,
        deserialize_with = "crate::whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 1048576, maximum = 1073741824)]
    pub bytes_per_second: Option<i64>,
}

fn in_range<T: TryFrom<i64> + Default>(
    value: i64,
    range: &RangeInclusive<i64>,
    field: &str,
    errors: &mut ValidationErrors,
) -> T {
    if !range.contains(&value) {
        errors.push(FieldError::invalid(
            field,
            format!("must be between {} and {} (got {value})", range.start(), range.end()),
        ));
    }
    T::try_from(value).unwrap_or_default()
}

impl QueueServiceRequest {
    /// The spec this request asks for, taking absent fields from `base`.
    pub fn spec_over(&self, base: QueueServiceSpec) -> Result<QueueServiceSpec, ValidationErrors> {
        let mut errors = ValidationErrors::default();
        let memory_mb = self
            .memory_mb
            .map_or(base.memory_mb, |v| in_range(v, &MEMORY_MB, "memoryMB", &mut errors));
        let storage_mb = self
            .storage_mb
            .map_or(base.storage_mb, |v| in_range(v, &STORAGE_MB, "storageMB", &mut errors));
        let persistence = self.persistence.unwrap_or(base.persistence);
        let durability = self.durability.unwrap_or(base.durability);
        if !persistence && durability != Durability::Disk {
            errors.push(FieldError::invalid(
                "durability",
                "applies only with persistence: without it messages live in memory only",
            ));
        }
        // A default of several replicas is for services that persist.
        let base_replicas = if persistence { base.replicas } else { 1 };
        let replicas = self.replicas.map_or(base_replicas, |v| {
            u8::try_from(v)
                .ok()
                .filter(|r| REPLICAS.contains(r))
                .unwrap_or_else(|| {
                    errors.push(FieldError::invalid("replicas", format!("must be 1 or 3 (got {v})")));
                    base.replicas
                })
        });
        if !persistence && replicas > 1 {
            errors.push(FieldError::invalid(
                "replicas",
                "more than one needs persistence: the replicas keep the queues in their logs",
            ));
        }
        let requests_per_second = self.requests_per_second.map_or(base.requests_per_second, |v| {
            Some(in_range(v, &REQUESTS_PER_SECOND, "requestsPerSecond", &mut errors))
        });
        let bytes_per_second = self.bytes_per_second.map_or(base.bytes_per_second, |v| {
            Some(in_range(v, &BYTES_PER_SECOND, "bytesPerSecond", &mut errors))
        });
        errors.into_result()?;
        Ok(QueueServiceSpec {
            memory_mb,
            storage_mb,
            persistence,
            durability,
            replicas,
            requests_per_second,
            bytes_per_second,
        })
    }
}

impl QueueServiceSpec {
    /// Checks that `self` can be reached from `current` in place.
    pub fn check_update_from(&self, current: &QueueServiceSpec) -> Result<(), ValidationErrors> {
        let mut errors = ValidationErrors::default();
        if self.persistence != current.persistence {
            errors.push(FieldError::invalid(
                "persistence",
                "cannot be changed in place; delete and recreate the queue service",
            ));
        }
        if self.storage_mb < current.storage_mb {
            errors.push(FieldError::invalid(
                "storageMB",
                format!(
                    "can only grow: a volume cannot shrink below its current {} MiB",
                    current.storage_mb
                ),
            ));
        }
        errors.into_result()
    }
}

/// Access keys of a queue service's SQS endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
}

/// Lifecycle phase of a queue service (seed 000's), the same in the API,
/// the QueueService status and the Terraform provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, schemars::JsonSchema)]
pub enum QueueServicePhase {
    /// Accepted and stored; nothing provisioned yet.
    Pending,
    /// Its queue engine is being created or started.
    Provisioning,
    /// Serving at its endpoint.
    Ready,
    /// Provisioned but not healthy; see `message`.
    Failed,
    /// Being torn down.
    Deleting,
}

impl QueueServicePhase {
    pub const ALL: [Self; 5] = [
        Self::Pending,
        Self::Provisioning,
        Self::Ready,
        Self::Failed,
        Self::Deleting,
    ];
}

/// Observed state of a queue service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueServiceStatus {
    pub phase: QueueServicePhase,
    pub message: Option<String>,
    pub endpoint: Option<String>,
    pub ready_at: Option<String>,
}

impl QueueServiceStatus {
    pub fn pending() -> Self {
        Self {
            phase: QueueServicePhase::Pending,
            message: Some("accepted; waiting to be provisioned".into()),
            endpoint: None,
            ready_at: None,
        }
    }
}

/// What the API returns for a queue service (and the provider reads).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueServiceView {
    pub name: String,
    pub tenant_id: String,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    #[serde(rename = "storageMB")]
    pub storage_mb: u32,
    pub persistence: bool,
    pub durability: Durability,
    pub replicas: u8,
    /// The queue service's own requests a second through each gateway;
    /// absent when the platform's default applies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_second: Option<u32>,
    /// The queue service's own request bytes a second likewise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<u64>,
    pub phase: QueueServicePhase,
    /// SQS endpoint URL for `endpoint_url`; set once Ready.
    pub endpoint: Option<String>,
    /// The region the queues' ARNs carry, for the SDKs' `region_name` (the
    /// gateway takes a signature of any region).
    pub region: String,
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
    pub message: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339; set when the service first became Ready.
    pub ready_at: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(memory: Option<i64>, storage: Option<i64>) -> QueueServiceRequest {
        QueueServiceRequest {
            memory_mb: memory,
            storage_mb: storage,
            ..Default::default()
        }
    }

    #[test]
    fn defaults_apply() {
        let spec = req(None, None).spec_over(QueueServiceSpec::default()).unwrap();
        assert_eq!(
            spec,
            QueueServiceSpec {
                memory_mb: 64,
                storage_mb: 512,
                persistence: true,
                durability: Durability::Disk,
                replicas: 1,
                requests_per_second: None,
                bytes_per_second: None,
            }
        );
    }

    #[test]
    fn a_queue_services_own_rates_are_bounded_and_kept_until_changed() {
        let asked = |body: &str| {
            serde_json::from_str::<QueueServiceRequest>(body)
                .unwrap()
                .spec_over(QueueServiceSpec::default())
        };
        let spec = asked(r#"{"requestsPerSecond":1,"bytesPerSecond":1073741824}"#).unwrap();
        assert_eq!(
            (spec.requests_per_second, spec.bytes_per_second),
            (Some(1), Some(1 << 30))
        );
        let e = asked(r#"{"requestsPerSecond":0,"bytesPerSecond":1048575}"#).unwrap_err();
        let fields: Vec<_> = e.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["requestsPerSecond", "bytesPerSecond"]);
        for wrong in [r#"{"requestsPerSecond":100001}"#, r#"{"requestsPerSecond":-1}"#] {
            assert!(asked(wrong).unwrap_err().0[0].message.contains("between 1 and 100000"));
        }
        assert!(serde_json::from_str::<QueueServiceRequest>(r#"{"requestsPerSecond":1.5}"#).is_err());
        // Absent: the base's, so a PATCH keeps them and a PUT (over the
        // defaults) returns to the platform's.
        let kept = QueueServiceRequest::default().spec_over(spec).unwrap();
        assert_eq!(kept.requests_per_second, Some(1));
        assert_eq!(asked("{}").unwrap().requests_per_second, None);
        // Stored without them, a record reads as the platform's default,
        // and is written back without them.
        let old: QueueServiceSpec =
            serde_json::from_str(r#"{"memoryMB":64,"storageMB":512,"persistence":true}"#).unwrap();
        assert_eq!(old.requests_per_second, None);
        assert!(!serde_json::to_string(&old).unwrap().contains("PerSecond"));
    }

    #[test]
    fn replicas_are_one_or_three_and_three_need_persistence() {
        let asked = |replicas: i64, persistence: bool| {
            QueueServiceRequest {
                replicas: Some(replicas),
                persistence: Some(persistence),
                ..Default::default()
            }
            .spec_over(QueueServiceSpec::default())
        };
        assert_eq!(asked(3, true).unwrap().replicas, 3);
        assert_eq!(asked(1, false).unwrap().replicas, 1);
        for wrong in [0, 2, 4, -1, 256 + 3] {
            let e = asked(wrong, true).unwrap_err();
            assert_eq!(e.0[0].field, "replicas", "{wrong}");
            assert!(e.0[0].message.contains("1 or 3"), "{}", e.0[0].message);
        }
        assert!(asked(3, false).unwrap_err().0[0].message.contains("persistence"));
        // Absent: the base's (the platform's default, or the current value).
        let three = QueueServiceSpec {
            replicas: 3,
            ..QueueServiceSpec::default()
        };
        assert_eq!(QueueServiceRequest::default().spec_over(three).unwrap().replicas, 3);
        // A default of three does not make an in-memory service invalid.
        let in_memory = QueueServiceRequest {
            persistence: Some(false),
            ..Default::default()
        };
        assert_eq!(in_memory.spec_over(three).unwrap().replicas, 1);
        let old: QueueServiceSpec =
            serde_json::from_str(r#"{"memoryMB":64,"storageMB":512,"persistence":true}"#).unwrap();
        assert_eq!(old.replicas, 1);
        let body: QueueServiceRequest = serde_json::from_str(r#"{"replicas":3.0}"#).unwrap();
        assert_eq!(body.replicas, Some(3));
        assert!(serde_json::from_str::<QueueServiceRequest>(r#"{"replicas":"3"}"#).is_err());
    }

    #[test]
    fn bounds_are_inclusive() {
        assert!(req(Some(32), Some(128)).spec_over(QueueServiceSpec::default()).is_ok());
        assert!(
            req(Some(1024), Some(10240))
                .spec_over(QueueServiceSpec::default())
                .is_ok()
        );
        let err = req(Some(31), Some(10241))
            .spec_over(QueueServiceSpec::default())
            .unwrap_err();
        let fields: Vec<_> = err.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["memoryMB", "storageMB"]);
    }

    #[test]
    fn durability_changes_in_place_and_needs_persistence() {
        let current = QueueServiceSpec::default();
        let request = QueueServiceRequest {
            durability: Some(Durability::Process),
            ..Default::default()
        };
        let spec = request.spec_over(current).unwrap();
        assert_eq!(spec.durability, Durability::Process);
        assert!(spec.check_update_from(&current).is_ok());
        let in_memory = QueueServiceRequest {
            persistence: Some(false),
            ..request
        };
        assert_eq!(in_memory.spec_over(current).unwrap_err().0[0].field, "durability");
        assert_eq!("process".parse::<Durability>().unwrap(), Durability::Process);
        assert_eq!("fsync".parse::<Durability>().unwrap_err().field, "durability");
        // Stored before the field existed.
        let old: QueueServiceSpec =
            serde_json::from_str(r#"{"memoryMB":64,"storageMB":512,"persistence":true}"#).unwrap();
        assert_eq!(old.durability, Durability::Disk);
    }

    #[test]
    fn persistence_is_immutable_and_storage_only_grows() {
        let current = QueueServiceSpec::default();
        let grown = QueueServiceSpec {
            storage_mb: 1024,
            memory_mb: 128,
            ..current
        };
        assert!(grown.check_update_from(&current).is_ok());
        let shrunk = QueueServiceSpec {
            storage_mb: 256,
            ..current
        };
        assert_eq!(shrunk.check_update_from(&current).unwrap_err().0[0].field, "storageMB");
        let flipped = QueueServiceSpec {
            persistence: false,
            ..current
        };
        assert_eq!(
            flipped.check_update_from(&current).unwrap_err().0[0].field,
            "persistence"
        );
    }
}
