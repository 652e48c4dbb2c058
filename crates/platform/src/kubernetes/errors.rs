//! What an API-server answer means to the tenant. A refusal about the
//! request (the custom resource's schema, an admission webhook, the
//! tenant's quota, its namespace being deleted, a concurrent change) keeps
//! its meaning and its reason. Everything else is the platform's fault and
//! "unavailable" to the tenant, its cause only in the log: an RBAC denial
//! (whose message names the platform's service account), an expired or
//! refused token, a missing CRD, a request the API server found malformed,
//! throttling and 5xx.

use kube::core::Status;
use sless_model::{FieldError, ValidationErrors};

use crate::PlatformError;

/// How the API server words an admission webhook's denial before its reason.
const DENIED: &str = "denied the request: ";

/// A create's error: a conflict there means the name is taken.
pub(super) fn on_create(e: kube::Error) -> PlatformError {
    match e {
        kube::Error::Api(status) if status.code == 409 => PlatformError::AlreadyExists,
        other => api_error(other),
    }
}

/// Any other call's error.
pub(super) fn api_error(e: kube::Error) -> PlatformError {
    let kube::Error::Api(status) = e else {
        return PlatformError::Unavailable(Box::new(e));
    };
    match status.code {
        // An object that is not there; not the kind itself (no CRD), which
        // is the platform's fault.
        404 if !is_missing_kind(&status) => PlatformError::NotFound,
        // 409 on a write is a resourceVersion that changed since the read;
        // 410 a watch or list position that expired. Both pass on a retry.
        409 | 410 => PlatformError::Conflict(
            "the object was changed by someone else since it was read; read it again and retry".into(),
        ),
        422 => PlatformError::Invalid(invalid(&status)),
        400 if is_admission_denial(&status) => PlatformError::BadRequest(reason(&status).to_owned()),
        403 if is_admission_denial(&status) || is_about_the_tenant(&status) => {
            PlatformError::Forbidden(reason(&status).to_owned())
        }
        413 => PlatformError::BadRequest(reason(&status).to_owned()),
        _ => PlatformError::Unavailable(Box::new(kube::Error::Api(status))),
    }
}

/// How the API server answers a path of a kind it does not serve: no
/// object named in the details.
fn is_missing_kind(status: &Status) -> bool {
    status.details.as_ref().is_none_or(|d| d.name.is_empty()) && status.message.contains(MISSING_KIND)
}

const MISSING_KIND: &str = "the server could not find the requested resource";

fn is_admission_denial(status: &Status) -> bool {
    status.message.contains(DENIED)
}

/// A 403 about the tenant's own state: its quota, its namespace being
/// deleted. Any other 403 is an authorization decision about the caller,
/// the platform's service account, or a quota not counted yet.
fn is_about_the_tenant(status: &Status) -> bool {
    [super::QUOTA_EXCEEDED, TERMINATING]
        .iter()
        .any(|m| status.message.contains(m))
}

/// How the API server refuses a create in a namespace being deleted.
const TERMINATING: &str = "because it is being terminated";

/// The refusal's own words: an admission denial without the webhook's name.
fn reason(status: &Status) -> &str {
    status
        .message
        .split_once(DENIED)
        .map_or(status.message.as_str(), |(_, reason)| reason)
}

/// Each cause at its field, as the REST API names fields: without the
/// custom resource's `spec.` prefix.
fn invalid(status: &Status) -> ValidationErrors {
    let causes = status.details.as_ref().map(|d| d.causes.as_slice()).unwrap_or_default();
    let errors: Vec<FieldError> = causes
        .iter()
        .map(|c| {
            let field = c.field.strip_prefix("spec.").unwrap_or(&c.field);
            FieldError::invalid(field, c.message.clone())
        })
        .collect();
    if errors.is_empty() {
        ValidationErrors(vec![FieldError::invalid("", reason(status))])
    } else {
        ValidationErrors(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            code,
            reason: reason.into(),
            message: message.into(),
            ..Status::failure(message, reason)
        }))
    }

    #[test]
    fn a_refusal_keeps_its_meaning_and_only_an_unreachable_cluster_is_unavailable() {
        let denied = status(
            400,
            "BadRequest",
            "admission webhook \"dataflows.sless.kube5s.ru\" denied the request: \
             sink.config.passwordSecretRef: a secret reference must stay in the namespace sless-fn-acme",
        );
        assert!(matches!(
            api_error(denied),
            PlatformError::BadRequest(m) if m == "sink.config.passwordSecretRef: a secret reference must stay in the namespace sless-fn-acme"
        ));
        let forbidden = status(
            403,
            "Forbidden",
            "dataflows \"x\" is forbidden: unable to create new content in namespace sless-fn-acme because it is being terminated",
        );
        assert!(matches!(api_error(forbidden), PlatformError::Forbidden(m) if m.contains("being terminated")));
        assert!(matches!(
            on_create(status(409, "AlreadyExists", "exists")),
            PlatformError::AlreadyExists
        ));
        assert!(matches!(
            api_error(status(409, "Conflict", "the object has been modified")),
            PlatformError::Conflict(_)
        ));
        assert!(matches!(
            api_error(status(410, "Expired", "too old")),
            PlatformError::Conflict(_)
        ));
        // As the API server answers a missing object: its name in details.
        let missing: Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "message": "dataflows.dataflow.dataflow.io \"x\" not found", "reason": "NotFound",
            "details": {"name": "x", "group": "dataflow.dataflow.io", "kind": "dataflows"}, "code": 404
        }))
        .unwrap();
        assert!(matches!(
            api_error(kube::Error::Api(Box::new(missing))),
            PlatformError::NotFound
        ));
        assert!(matches!(
            api_error(status(413, "RequestEntityTooLarge", "too large")),
            PlatformError::BadRequest(_)
        ));
        let quota = status(
            403,
            "Forbidden",
            "dataflows.dataflow.dataflow.io \"x\" is forbidden: exceeded quota: sless-tenant, requested: count/dataflows.dataflow.dataflow.io=1",
        );
        assert!(matches!(api_error(quota), PlatformError::Forbidden(_)));
    }

    /// The platform's own faults never reach the tenant as the tenant's:
    /// not as a 403 naming the platform's service account, not as a 400
    /// or a 404.
    #[test]
    fn the_platforms_faults_are_unavailable_and_name_nothing_of_it() {
        let rbac = status(
            403,
            "Forbidden",
            "dataflows.dataflow.dataflow.io is forbidden: User \"system:serviceaccount:sless-system:sless-operator\" \
             cannot create resource \"dataflows\" in API group \"dataflow.dataflow.io\" in the namespace \"sless-fn-a\"",
        );
        let expired = status(401, "Unauthorized", "Unauthorized");
        let uncounted = status(
            403,
            "Forbidden",
            "dataflows.dataflow.dataflow.io \"x\" is forbidden: status unknown for quota: sless-tenant, resources: count/dataflows.dataflow.dataflow.io",
        );
        let no_crd = status(404, "NotFound", "the server could not find the requested resource");
        let malformed = status(400, "BadRequest", "the body of the request was in an unknown format");
        for fault in [rbac, expired, uncounted, no_crd, malformed] {
            assert!(matches!(api_error(fault), PlatformError::Unavailable(_)));
        }
        for code in [429, 500, 503, 504] {
            assert!(
                matches!(api_error(status(code, "x", "y")), PlatformError::Unavailable(_)),
                "{code}"
            );
        }
    }

    /// The body the API server answers when the CRD's schema refuses a
    /// QueueService, as it writes it.
    #[test]
    fn a_schema_refusal_names_each_field_as_the_rest_api_does() {
        let refused: Status = serde_json::from_value(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "QueueService.sless.kube5s.ru \"main\" is invalid: [spec.memoryMB: Invalid value: 4096: \
                        spec.memoryMB in body should be less than or equal to 1024, spec.tenantId: Invalid value: \"a\"]",
            "reason": "Invalid",
            "details": {"name": "main", "group": "sless.kube5s.ru", "kind": "QueueService", "causes": [
                {"reason": "FieldValueInvalid",
                 "message": "Invalid value: 4096: spec.memoryMB in body should be less than or equal to 1024",
                 "field": "spec.memoryMB"},
                {"reason": "FieldValueInvalid", "message": "Invalid value: \"a\"", "field": "spec.tenantId"}
            ]},
            "code": 422
        }))
        .unwrap();
        let PlatformError::Invalid(errors) = api_error(kube::Error::Api(Box::new(refused))) else {
            panic!("a 422 is a validation failure");
        };
        let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["memoryMB", "tenantId"]);
        assert!(errors.0[0].message.contains("less than or equal to 1024"));
    }
}
