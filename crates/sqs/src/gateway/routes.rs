//! The gateway's routing table, built from the queue services: `sless dev`'s
//! local platform and `sless serve`'s route publisher hand it to the control
//! plane's snapshot publisher.

use sless_controlplane::proto::{AccessKey, RoutingSnapshot, TenantRoute};
use sless_model::queue_service::Credentials;

use super::table::{InvalidRoute, usable};

/// One tenant's route: where its queue engine listens (if it runs) and the
/// keys that may sign its requests.
pub struct Route<'a> {
    pub tenant: &'a str,
    pub backend_address: Option<&'a str>,
    /// The secret the engine expects from the gateway.
    pub backend_token: Option<&'a str>,
    pub credentials: &'a Credentials,
    /// The queue service's own rates; `None`: the gateway's default.
    pub requests_per_second: Option<u32>,
    pub bytes_per_second: Option<u64>,
}

/// The snapshot of the routes a gateway can use, and those it could not
/// (a malformed key, a tenant named twice), logged and left out so that
/// they never hold back the other tenants' routes.
pub fn snapshot<'a>(routes: impl IntoIterator<Item = Route<'a>>) -> (RoutingSnapshot, Vec<InvalidRoute>) {
    let routes = routes
        .into_iter()
        .map(|r| TenantRoute {
            tenant: r.tenant.to_owned(),
            backend_address: r.backend_address.unwrap_or_default().to_owned(),
            backend_token: r.backend_token.unwrap_or_default().to_owned(),
            keys: vec![AccessKey {
                access_key_id: r.credentials.access_key.clone(),
                secret_access_key: r.credentials.secret_key.clone(),
            }],
            requests_per_second: r.requests_per_second.unwrap_or_default(),
            bytes_per_second: r.bytes_per_second.unwrap_or_default(),
        })
        .collect();
    let (routes, left_out) = usable(routes);
    for route in &left_out {
        tracing::warn!(tenant = %route.tenant, reason = %route.reason, "route left out of the routing table");
    }
    (RoutingSnapshot { routes }, left_out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(access_key: &str, secret_key: &str) -> Credentials {
        Credentials {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
        }
    }

    #[test]
    fn one_route_per_tenant_with_its_keys() {
        let (creds, others) = (keys("SQSAKa_12345678", "secret"), keys("SQSAKb_12345678", "secret"));
        let (table, left_out) = snapshot([
            Route {
                tenant: "a",
                backend_address: Some("127.0.0.1:9324"),
                backend_token: Some("t0k3n"),
                credentials: &creds,
                requests_per_second: Some(50),
                bytes_per_second: None,
            },
            Route {
                tenant: "b",
                backend_address: None,
                backend_token: None,
                credentials: &others,
                requests_per_second: None,
                bytes_per_second: None,
            },
        ]);
        assert_eq!(table.routes.len(), 2);
        assert!(left_out.is_empty());
        assert_eq!(table.routes[0].backend_address, "127.0.0.1:9324");
        assert_eq!(table.routes[0].backend_token, "t0k3n");
        assert_eq!(table.routes[1].backend_address, "", "not provisioned yet");
        assert_eq!(table.routes[0].keys[0].access_key_id, "SQSAKa_12345678");
        // The queue service's own rates; 0 where it has none (the gateway's).
        assert_eq!(
            (table.routes[0].requests_per_second, table.routes[0].bytes_per_second),
            (50, 0)
        );
        assert_eq!(table.routes[1].requests_per_second, 0);
    }

    /// A queue service whose keys are broken (a Secret edited by hand) is
    /// left out of the snapshot; the other tenants' routes are published.
    #[test]
    fn a_bad_route_does_not_hold_back_the_others() {
        let (good, broken) = (keys("SQSAKa_12345678", "secret"), keys("SQSAKb_12345678", ""));
        let (table, left_out) = snapshot([
            Route {
                tenant: "a",
                backend_address: Some("127.0.0.1:9324"),
                backend_token: None,
                credentials: &good,
                requests_per_second: None,
                bytes_per_second: None,
            },
            Route {
                tenant: "b",
                backend_address: Some("127.0.0.1:9325"),
                backend_token: None,
                credentials: &broken,
                requests_per_second: None,
                bytes_per_second: None,
            },
        ]);
        let tenants: Vec<&str> = table.routes.iter().map(|r| r.tenant.as_str()).collect();
        assert_eq!(tenants, ["a"]);
        assert_eq!(left_out[0].tenant, "b");
        assert_eq!(left_out[0].reason, "an access key is empty");
    }
}
