//! The gateway's routing table, built from the queue services: `sless dev`'s
//! local platform and `sless serve`'s route publisher hand it to the control
//! plane's snapshot publisher.

use sless_controlplane::proto::{AccessKey, RoutingSnapshot, TenantRoute};
use sless_model::queue_service::Credentials;

/// One tenant's route: where its queue engine listens (if it runs) and the
/// keys that may sign its requests.
pub struct Route<'a> {
    pub tenant: &'a str,
    pub backend_address: Option<&'a str>,
    /// The secret the engine expects from the gateway.
    pub backend_token: Option<&'a str>,
    pub credentials: &'a Credentials,
}

pub fn snapshot<'a>(routes: impl IntoIterator<Item = Route<'a>>) -> RoutingSnapshot {
    RoutingSnapshot {
        routes: routes
            .into_iter()
            .map(|r| TenantRoute {
                tenant: r.tenant.to_owned(),
                backend_address: r.backend_address.unwrap_or_default().to_owned(),
                backend_token: r.backend_token.unwrap_or_default().to_owned(),
                keys: vec![AccessKey {
                    access_key_id: r.credentials.access_key.clone(),
                    secret_access_key: r.credentials.secret_key.clone(),
                }],
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_route_per_tenant_with_its_keys() {
        let creds = Credentials {
            access_key: "SQSAKa_12345678".into(),
            secret_key: "secret".into(),
        };
        let table = snapshot([
            Route {
                tenant: "a",
                backend_address: Some("127.0.0.1:9324"),
                backend_token: Some("t0k3n"),
                credentials: &creds,
            },
            Route {
                tenant: "b",
                backend_address: None,
                backend_token: None,
                credentials: &creds,
            },
        ]);
        assert_eq!(table.routes.len(), 2);
        assert_eq!(table.routes[0].backend_address, "127.0.0.1:9324");
        assert_eq!(table.routes[0].backend_token, "t0k3n");
        assert_eq!(table.routes[1].backend_address, "", "not provisioned yet");
        assert_eq!(table.routes[0].keys[0].access_key_id, "SQSAKa_12345678");
    }
}
