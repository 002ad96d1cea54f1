//! The cert-manager kind the controller writes, a `Certificate` (`cert-manager.io/v1`),
//! as much of it as an AppService with `spec.expose.tls.issuerRef` sets and reads: the
//! host names, the issuer, the Secret to write. cert-manager issues and renews it; the
//! Gateway serves the Secret.

use std::borrow::Cow;

use common::types::ExposeSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Serialize};

use crate::gateway_api::{RouteCondition, Typed};

/// cert-manager's API group.
pub const GROUP: &str = "cert-manager.io";

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Certificate {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: CertificateSpec,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSpec {
    pub secret_name: String,
    pub dns_names: Vec<String>,
    pub issuer_ref: CertificateIssuer,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CertificateIssuer {
    pub name: String,
    pub kind: String,
    pub group: String,
}

impl CertificateSpec {
    /// For every host name of `expose`, from its issuer into its Secret (`app`'s default
    /// when it names none); `None` without an issuer.
    pub fn of(app: &str, expose: &ExposeSpec) -> Option<Self> {
        let tls = expose.tls.as_ref()?;
        let issuer = tls.issuer_ref.as_ref()?;
        Some(CertificateSpec {
            secret_name: tls.secret(app),
            dns_names: expose.hostnames.clone(),
            issuer_ref: CertificateIssuer {
                name: issuer.name.clone(),
                kind: issuer.kind.clone().unwrap_or_else(|| "Issuer".to_owned()),
                group: issuer.group.clone().unwrap_or_else(|| GROUP.to_owned()),
            },
        })
    }
}

impl Serialize for Certificate {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Rest<'a> {
            spec: &'a CertificateSpec,
        }
        Typed {
            api_version: Self::api_version(&()),
            kind: Self::kind(&()),
            metadata: &self.metadata,
            rest: Rest { spec: &self.spec },
        }
        .serialize(serializer)
    }
}

impl Resource for Certificate {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Certificate".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn api_version(_: &()) -> Cow<'_, str> {
        format!("{GROUP}/v1").into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "certificates".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What a Certificate's `Ready` condition says: issued (`Ok`), or why not yet.
pub fn issued(ready: Option<&RouteCondition>) -> Result<(), String> {
    match ready {
        Some(c) if c.status == "True" => Ok(()),
        Some(c) if !c.message.is_empty() => Err(format!("{}: {}", c.reason, c.message)),
        Some(c) => Err(c.reason.clone()),
        None => Err("not issued yet".to_owned()),
    }
}
