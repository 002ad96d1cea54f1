//! The HTTPRoute of an AppService with `spec.expose`: requests for its host names (under
//! its paths) that arrive at the Gateway the cluster's admin named go to its Service.

use common::names::{route_name, service_name};

use super::child_metadata;
use k8s_openapi::api::networking::v1::{
    HTTPIngressPath, HTTPIngressRuleValue, Ingress, IngressBackend, IngressRule,
    IngressServiceBackend, IngressSpec, IngressTLS, ServiceBackendPort,
};

use crate::cert_manager::{Certificate, CertificateSpec};
use crate::config::GatewayRef;
use crate::gateway_api::{
    BackendRef, GROUP, GrantFrom, GrantSpec, GrantTo, HttpRoute, ParentRef, PathMatch,
    ReferenceGrant, RouteMatch, RouteRule, RouteSpec,
};
use crate::subject::Subject;

/// The route `<name>` while `spec.expose` asks for one and a Gateway is configured.
pub fn desired_route(app: &Subject, gateway: Option<&GatewayRef>) -> Option<HttpRoute> {
    let expose = app.spec.expose.as_ref()?;
    let gateway = gateway?;
    let port = exposed_port(app)?;
    Some(HttpRoute {
        metadata: child_metadata(app, route_name(app.name())),
        spec: RouteSpec {
            parent_refs: vec![ParentRef::gateway(&gateway.namespace, &gateway.name)],
            hostnames: expose.hostnames.clone(),
            rules: vec![RouteRule {
                matches: expose
                    .paths()
                    .into_iter()
                    .map(|path| RouteMatch {
                        path: PathMatch::prefix(path),
                    })
                    .collect(),
                backend_refs: vec![BackendRef::service(&service_name(app.name()), port)],
            }],
        },
        status: None,
    })
}

/// The Ingress `<name>` of class `class` while `spec.expose` asks for one and the cluster
/// exposes through Ingresses (no Gateway named): a rule per host name with the paths as
/// prefixes, and with `tls` the Secret for all of them (an Ingress reads Secrets of its
/// own namespace, so no grant is needed).
pub fn desired_ingress(app: &Subject, class: Option<&str>) -> Option<Ingress> {
    let expose = app.spec.expose.as_ref()?;
    let class = class?;
    let port = exposed_port(app)?;
    let paths: Vec<HTTPIngressPath> = expose
        .paths()
        .into_iter()
        .map(|path| HTTPIngressPath {
            path: Some(path.to_owned()),
            path_type: "Prefix".to_owned(),
            backend: IngressBackend {
                service: Some(IngressServiceBackend {
                    name: service_name(app.name()),
                    port: Some(ServiceBackendPort {
                        number: Some(port),
                        name: None,
                    }),
                }),
                resource: None,
            },
        })
        .collect();
    Some(Ingress {
        metadata: child_metadata(app, route_name(app.name())),
        spec: Some(IngressSpec {
            ingress_class_name: Some(class.to_owned()),
            rules: Some(
                expose
                    .hostnames
                    .iter()
                    .map(|host| IngressRule {
                        host: Some(host.clone()),
                        http: Some(HTTPIngressRuleValue {
                            paths: paths.clone(),
                        }),
                    })
                    .collect(),
            ),
            tls: expose.tls.as_ref().map(|tls| {
                vec![IngressTLS {
                    hosts: Some(expose.hostnames.clone()),
                    secret_name: Some(tls.secret(app.name())),
                }]
            }),
            default_backend: None,
        }),
        status: None,
    })
}

/// The Service port requests go to: `spec.expose.port`'s number, else the first port's.
fn exposed_port(app: &Subject) -> Option<i32> {
    let expose = app.spec.expose.as_ref()?;
    match expose.port.as_deref() {
        Some(name) => Some(app.spec.ports().iter().find(|p| p.name == name)?.port),
        None => Some(app.spec.port()),
    }
}

/// The Certificate `<name>` while `spec.expose.tls.issuerRef` asks cert-manager for one
/// (and cert-manager is enabled for this controller).
pub fn desired_certificate(
    app: &Subject,
    exposing: bool,
    cert_manager: bool,
) -> Option<Certificate> {
    if !exposing || !cert_manager {
        return None;
    }
    Some(Certificate {
        metadata: child_metadata(app, route_name(app.name())),
        spec: CertificateSpec::of(app.name(), app.spec.expose.as_ref()?)?,
    })
}

/// The ReferenceGrant `<name>` while `spec.expose.tls` asks for HTTPS: the configured
/// Gateway may read the AppService's TLS Secret, that one Secret and nothing else.
pub fn desired_grant(app: &Subject, gateway: Option<&GatewayRef>) -> Option<ReferenceGrant> {
    let tls = app.spec.expose.as_ref()?.tls.as_ref()?;
    let gateway = gateway?;
    Some(ReferenceGrant {
        metadata: child_metadata(app, route_name(app.name())),
        spec: GrantSpec {
            from: vec![GrantFrom {
                group: GROUP.to_owned(),
                kind: "Gateway".to_owned(),
                namespace: gateway.namespace.clone(),
            }],
            to: vec![GrantTo {
                group: String::new(),
                kind: "Secret".to_owned(),
                name: Some(tls.secret(app.name())),
            }],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subject::subject;
    use common::testing::stored;
    use common::{AppPort, AppServiceSpec, ExposeSpec};

    fn gateway() -> GatewayRef {
        GatewayRef {
            namespace: "gateways".into(),
            name: "public".into(),
        }
    }

    #[test]
    fn it_sends_the_host_names_and_paths_to_the_service_port() {
        let mut spec = AppServiceSpec {
            image: "registry.example.com/shop:1".into(),
            ports: vec![
                AppPort::http(8080),
                AppPort {
                    name: "admin".into(),
                    port: 9090,
                    protocol: None,
                },
            ],
            ..AppServiceSpec::default()
        };
        assert!(desired_route(&subject(&stored("shop", spec.clone())), Some(&gateway())).is_none());
        spec.expose = Some(ExposeSpec {
            hostnames: vec!["shop.example.com".into()],
            paths: vec![],
            port: None,
            tls: None,
        });
        let app = stored("shop", spec.clone());
        assert!(
            desired_route(&subject(&app), None).is_none(),
            "no Gateway, no route"
        );
        let route = desired_route(&subject(&app), Some(&gateway())).unwrap();
        let json = serde_json::to_value(&route.spec).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "gateways", "name": "public"}],
                "hostnames": ["shop.example.com"],
                "rules": [{
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "backendRefs": [{"group": "", "kind": "Service", "name": "shop", "port": 8080, "weight": 1}],
                }],
            })
        );
        assert_eq!(route.metadata.name.as_deref(), Some("shop"));
        assert!(route.metadata.owner_references.unwrap()[0].controller == Some(true));

        spec.expose = Some(ExposeSpec {
            hostnames: vec!["shop.example.com".into()],
            paths: vec!["/admin".into(), "/debug".into()],
            port: Some("admin".into()),
            tls: None,
        });
        assert!(desired_grant(&subject(&stored("shop", spec.clone())), Some(&gateway())).is_none());
        let route =
            desired_route(&subject(&stored("shop", spec.clone())), Some(&gateway())).unwrap();
        let rule = &route.spec.rules[0];
        assert_eq!(rule.backend_refs[0].port, Some(9090));
        let paths: Vec<&str> = rule.matches.iter().map(|m| m.path.value.as_str()).collect();
        assert_eq!(paths, ["/admin", "/debug"]);
    }
}

#[cfg(test)]
mod grant_tests {
    use super::*;
    use crate::subject::subject;
    use common::testing::stored;
    use common::{AppServiceSpec, ExposeSpec, ExposeTls};

    #[test]
    fn the_gateway_may_read_the_tls_secret_and_nothing_else() {
        let gateway = GatewayRef {
            namespace: "gateways".into(),
            name: "public".into(),
        };
        let spec = AppServiceSpec {
            image: "registry.example.com/shop:1".into(),
            expose: Some(ExposeSpec {
                hostnames: vec!["shop.example.com".into()],
                tls: Some(ExposeTls {
                    secret_name: Some("shop-tls".into()),
                    issuer_ref: None,
                }),
                ..ExposeSpec::default()
            }),
            ..AppServiceSpec::default()
        };
        let app = stored("shop", spec);
        assert!(desired_grant(&subject(&app), None).is_none());
        let grant = desired_grant(&subject(&app), Some(&gateway)).unwrap();
        assert_eq!(
            serde_json::to_value(&grant.spec).unwrap(),
            serde_json::json!({
                "from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "gateways"}],
                "to": [{"group": "", "kind": "Secret", "name": "shop-tls"}],
            })
        );
    }
}
