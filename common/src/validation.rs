//! Validation: every rule an AppService must satisfy, as one pure function.
//!
//! The validating webhook calls it on every write, the controller calls it again before
//! acting (defence in depth when the webhook is bypassed), and the CRD schema carries the
//! subset the API server can check itself. All errors are collected, each with its field
//! path and in Kubernetes' format (`spec.port: Invalid value: 70000: must be between 1 and
//! 65535`), so a user fixes everything in one round trip.
//!
//! The rules are written once, for the hub (`v1beta1`). A `v1alpha1` object is validated
//! by converting it ([`crate::conversion`]) and naming the fields as `v1alpha1` has them
//! ([`validate_v1alpha1`]), so both versions accept exactly the same objects.

use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};

use crate::quantity::Amount;
use k8s_openapi::api::core::v1::{EnvVarSource, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::names::{DATABASE_CA_DIR, DATABASE_URL_ENV};
use crate::types::{
    AppService, AppServiceSpec, CanarySpec, MAX_CLASS_LEN, MAX_CONFIG_SOURCES, MAX_ENV,
    MAX_ENV_NAME_LEN, MAX_ENV_VALUE_LEN, MAX_EXPOSE_HOSTNAMES, MAX_EXPOSE_PATH_LEN,
    MAX_EXPOSE_PATHS, MAX_ID, MAX_IMAGE_LEN, MAX_LABEL_LEN, MAX_MOUNT_PATH_LEN, MAX_NAME_LEN,
    MAX_PORT, MAX_PORT_NAME_LEN, MAX_PORTS, MAX_REPLICAS, MAX_ROLLOUT_PERCENT, MAX_SUBDOMAIN_LEN,
    MAX_TARGET_CPU_UTILIZATION, MIN_AUTOSCALING_REPLICAS, MIN_CANARY_REPLICAS, MIN_ID,
    MIN_NON_ROOT_UID, MIN_PORT, MIN_REPLICAS, MIN_TARGET_CPU_UTILIZATION, PodSecurity, RolloutSpec,
    SecurityProfile,
};
use crate::{conversion, v1alpha1};

pub use crate::field_errors::{ErrorType, FieldError, FieldErrors, Warnings};

/// Errors and warnings of one validation, for callers that want both (the webhook
/// returns warnings even on a denial).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub errors: FieldErrors,
    pub warnings: Warnings,
}

/// Validates `new`; `old` is the stored object on UPDATE and enables the update rules.
/// Returns the warnings when valid, every field error otherwise.
pub fn validate(new: &AppService, old: Option<&AppService>) -> Result<Warnings, FieldErrors> {
    let report = validate_report(new, old);
    if report.errors.is_empty() {
        Ok(report.warnings)
    } else {
        Err(report.errors)
    }
}

/// Like [`validate`], but returns errors and warnings together.
pub fn validate_report(new: &AppService, old: Option<&AppService>) -> Report {
    let mut report = Report::default();
    validate_name(new, &mut report.errors.0);
    validate_spec(&new.spec, &mut report);
    if let Some(old) = old {
        validate_update(&new.spec, &old.spec, &mut report.errors.0);
    }
    report
}

/// [`validate`] for a `v1alpha1` object: the hub's rules on its conversion, with field
/// paths as the `v1alpha1` client wrote them (`spec.port`, not `spec.ports[0].port`).
pub fn validate_v1alpha1(
    new: &v1alpha1::AppService,
    old: Option<&v1alpha1::AppService>,
) -> Result<Warnings, FieldErrors> {
    let report = validate_v1alpha1_report(new, old);
    if report.errors.is_empty() {
        Ok(report.warnings)
    } else {
        Err(report.errors)
    }
}

/// Like [`validate_v1alpha1`], but returns errors and warnings together.
pub fn validate_v1alpha1_report(
    new: &v1alpha1::AppService,
    old: Option<&v1alpha1::AppService>,
) -> Report {
    let hub = conversion::to_v1beta1(new);
    let old = old.map(conversion::to_v1beta1);
    let mut report = validate_report(&hub, old.as_ref());
    for error in &mut report.errors.0 {
        if let Some(rest) = error.field.strip_prefix("spec.ports[0].port") {
            error.field = format!("spec.port{rest}");
        }
    }
    report
}

fn validate_name(app: &AppService, errors: &mut Vec<FieldError>) {
    // With generateName the name is assigned after the mutating webhook ran; the
    // validating webhook and the controller always see it.
    let Some(name) = app.metadata.name.as_deref().filter(|n| !n.is_empty()) else {
        if app
            .metadata
            .generate_name
            .as_deref()
            .is_none_or(str::is_empty)
        {
            errors.push(FieldError::required(
                "metadata.name",
                "name or generateName is required",
            ));
        }
        return;
    };
    if name.len() > MAX_NAME_LEN {
        errors.push(FieldError::invalid_str(
            "metadata.name",
            name,
            format!("must be no more than {MAX_NAME_LEN} characters: it names the Service"),
        ));
    } else if !is_dns1035_label(name) {
        errors.push(FieldError::invalid_str(
            "metadata.name",
            name,
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name', or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
        ));
    }
}

fn validate_spec(spec: &AppServiceSpec, report: &mut Report) {
    let errors = &mut report.errors.0;
    validate_image("spec.image", &spec.image, errors, &mut report.warnings);
    if let Some(replicas) = spec.replicas
        && !(MIN_REPLICAS..=MAX_REPLICAS).contains(&replicas)
    {
        errors.push(FieldError::invalid_int(
            "spec.replicas",
            replicas.into(),
            format!("must be between {MIN_REPLICAS} and {MAX_REPLICAS}"),
        ));
    }
    validate_ports(spec, errors);
    if let Some(security) = &spec.pod_security {
        validate_pod_security(security, errors);
    }
    if let Some(rollout) = &spec.rollout {
        validate_rollout(rollout, errors);
    }
    if let Some(canary) = &spec.canary {
        validate_canary(canary, spec.replicas(), errors, &mut report.warnings);
    }
    validate_env(spec, errors);
    validate_config(spec, errors);
    if let Some(autoscaling) = &spec.autoscaling {
        validate_autoscaling(spec, autoscaling, errors);
    }
    if let Some(expose) = &spec.expose {
        validate_expose(spec, expose, errors);
    }
    if let Some(resources) = &spec.resources {
        validate_resources(resources, errors);
    }
    if let Some(db) = &spec.database {
        match Some(db.class.as_str()) {
            None | Some("") => errors.push(FieldError::required(
                "spec.database.class",
                "required when a database is requested",
            )),
            Some(class) if class.len() > MAX_CLASS_LEN => {
                errors.push(FieldError::too_long("spec.database.class", MAX_CLASS_LEN));
            }
            Some(class) if !is_dns1123_subdomain(class) => errors.push(FieldError::invalid_str(
                "spec.database.class",
                class,
                "must be a lowercase RFC 1123 subdomain (e.g. 'production-postgresql')",
            )),
            Some(_) => {}
        }
    }
}

fn validate_ports(spec: &AppServiceSpec, errors: &mut Vec<FieldError>) {
    if spec.ports.len() > MAX_PORTS {
        errors.push(FieldError::too_many(
            "spec.ports",
            spec.ports.len(),
            MAX_PORTS,
        ));
    }
    let mut names = HashSet::new();
    let mut numbers = HashSet::new();
    for (i, port) in spec.ports.iter().enumerate() {
        let field = format!("spec.ports[{i}]");
        if port.name.is_empty() {
            errors.push(FieldError::required(format!("{field}.name"), ""));
        } else if port.name.len() > MAX_PORT_NAME_LEN {
            errors.push(FieldError::too_long(
                format!("{field}.name"),
                MAX_PORT_NAME_LEN,
            ));
        } else if !is_iana_svc_name(&port.name) {
            errors.push(FieldError::invalid_str(
                format!("{field}.name"),
                &port.name,
                "must be an IANA service name: lowercase letters, digits and '-', at least one letter, no '--', not starting or ending with '-'",
            ));
        } else if !names.insert(port.name.as_str()) {
            errors.push(FieldError::duplicate(format!("{field}.name"), &port.name));
        }
        if !(MIN_PORT..=MAX_PORT).contains(&port.port) {
            errors.push(FieldError::invalid_int(
                format!("{field}.port"),
                port.port.into(),
                format!("must be between {MIN_PORT} and {MAX_PORT}"),
            ));
        } else if !numbers.insert((port.port, port.protocol())) {
            errors.push(
                FieldError::new(
                    format!("{field}.port"),
                    ErrorType::Duplicate,
                    format!(
                        "port {} is already used with protocol {}",
                        port.port,
                        port.protocol().as_str()
                    ),
                )
                .with_value(port.port.to_string()),
            );
        }
    }
}

/// The ids are what Kubernetes accepts in a Pod; root is refused where the profile the
/// template must meet forbids it, here rather than as Pods the namespace rejects later.
fn validate_pod_security(security: &PodSecurity, errors: &mut Vec<FieldError>) {
    const FIELD: &str = "spec.podSecurity";
    for (name, id) in [
        ("runAsUser", security.run_as_user),
        ("runAsGroup", security.run_as_group),
        ("fsGroup", security.fs_group),
    ] {
        if let Some(id) = id
            && !(MIN_ID..=MAX_ID).contains(&id)
        {
            errors.push(FieldError::invalid_int(
                format!("{FIELD}.{name}"),
                id,
                format!("must be between {MIN_ID} and {MAX_ID}, inclusive"),
            ));
        }
    }
    if security.profile() == SecurityProfile::Restricted
        && let Some(uid) = security.run_as_user
        && (MIN_ID..MIN_NON_ROOT_UID).contains(&uid)
    {
        errors.push(FieldError::invalid_int(
            format!("{FIELD}.runAsUser"),
            uid,
            "runAsUser 0 is root, which the Restricted profile forbids; use profile Baseline for an image that must run as root",
        ));
    }
}

/// A Deployment's rules for its rolling update: each setting a non-negative number or a
/// percentage of at most 100%, and not both 0 (a rollout that could never replace a Pod).
fn validate_rollout(rollout: &RolloutSpec, errors: &mut Vec<FieldError>) {
    const FIELD: &str = "spec.rollout";
    let mut zero = [false, false];
    for (i, (name, value)) in [
        ("maxSurge", &rollout.max_surge),
        ("maxUnavailable", &rollout.max_unavailable),
    ]
    .into_iter()
    .enumerate()
    {
        let Some(value) = value else { continue };
        let field = format!("{FIELD}.{name}");
        match int_or_percent(value) {
            Ok(n) => zero[i] = n == 0,
            Err(detail) => errors.push(match value {
                IntOrString::Int(n) => FieldError::invalid_int(field, (*n).into(), detail),
                IntOrString::String(s) => FieldError::invalid_str(field, s, detail),
            }),
        }
    }
    if zero == [true, true]
        && let Some(value) = &rollout.max_unavailable
    {
        let field = format!("{FIELD}.maxUnavailable");
        let detail = "may not be 0 when `maxSurge` is 0";
        errors.push(match value {
            IntOrString::Int(n) => FieldError::invalid_int(field, (*n).into(), detail),
            IntOrString::String(s) => FieldError::invalid_str(field, s, detail),
        });
    }
}

/// The number a rollout setting stands for (a percentage as its number), or why it is
/// none: Kubernetes' `IsValidPercent` (`^[0-9]+%$`) with at most 100%, or an integer of
/// at least 0.
fn int_or_percent(value: &IntOrString) -> Result<u32, String> {
    match value {
        IntOrString::Int(n) => {
            u32::try_from(*n).map_err(|_| "must be greater than or equal to 0".to_owned())
        }
        IntOrString::String(s) => {
            let digits = s
                .strip_suffix('%')
                .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
            let Some(digits) = digits else {
                return Err("a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')".to_owned());
            };
            // Leading zeros are allowed, as Kubernetes parses them; anything past
            // three digits is past 100%.
            let trimmed = digits.trim_start_matches('0');
            match trimmed.parse::<u32>() {
                Ok(n) if n <= MAX_ROLLOUT_PERCENT => Ok(n),
                _ if trimmed.is_empty() => Ok(0),
                _ => Err(format!("must not be greater than {MAX_ROLLOUT_PERCENT}%")),
            }
        }
    }
}

/// The canary's image meets every rule of `spec.image` (and any policy on images must
/// read both); its replicas are some of the AppService's, at least one.
fn validate_canary(
    canary: &CanarySpec,
    replicas: i32,
    errors: &mut Vec<FieldError>,
    warnings: &mut Warnings,
) {
    validate_image("spec.canary.image", &canary.image, errors, warnings);
    let n = canary.replicas();
    if n < MIN_CANARY_REPLICAS {
        errors.push(FieldError::invalid_int(
            "spec.canary.replicas",
            n.into(),
            format!("must be at least {MIN_CANARY_REPLICAS}: remove spec.canary to run no canary"),
        ));
    } else if n > replicas {
        errors.push(FieldError::invalid_int(
            "spec.canary.replicas",
            n.into(),
            format!("must not be greater than spec.replicas ({replicas}): the canary's Pods are some of the AppService's"),
        ));
    }
}

fn validate_image(field: &str, image: &str, errors: &mut Vec<FieldError>, warnings: &mut Warnings) {
    if image.is_empty() {
        errors.push(FieldError::required(
            field,
            "an OCI image reference such as registry.example.com/app:v1.2.3",
        ));
        return;
    }
    if image.len() > MAX_IMAGE_LEN {
        errors.push(FieldError::too_long(field, MAX_IMAGE_LEN));
        return;
    }
    // The parser accepts surrounding whitespace in some positions; the kubelet does not.
    if image.trim() != image {
        errors.push(FieldError::invalid_str(
            field,
            image,
            "must not contain leading or trailing whitespace",
        ));
        return;
    }
    let reference = image_facts(image);
    if let Some(err) = reference.error {
        errors.push(FieldError::invalid_str(
            field,
            image,
            format!("not a valid image reference: {err}"),
        ));
        return;
    }
    if let Some(both) = reference.tag_and_digest {
        warnings.push(format!("{field} {both}"));
    }
    if reference.digest {
        return;
    }
    // The parser fills in `latest` when no tag is given; look at what the user wrote.
    let last_component = image.rsplit('/').next().unwrap_or(image);
    if !last_component.contains(':') {
        warnings.push(format!(
            "{field}: {image:?} has no tag and resolves to :latest; pin a version tag or a digest so rollouts are reproducible"
        ));
    } else if reference.latest {
        warnings.push(format!(
            "{field}: {image:?} uses the mutable :latest tag; pin a version tag or a digest so rollouts are reproducible"
        ));
    }
}

/// What validation needs to know of an image reference.
#[derive(Clone, Debug)]
struct ImageFacts {
    error: Option<String>,
    digest: bool,
    latest: bool,
    /// [`crate::image::tag_and_digest`]'s warning.
    tag_and_digest: Option<String>,
}

/// Parses an image reference ([`crate::image`]). The same images come back on every
/// update, so the last results are kept, per thread.
fn image_facts(image: &str) -> ImageFacts {
    const RECENT: usize = 64;
    thread_local! {
        static CACHE: RefCell<VecDeque<(String, ImageFacts)>> =
            RefCell::new(VecDeque::with_capacity(RECENT));
    }
    let cached = CACHE.with(|cache| {
        cache
            .borrow()
            .iter()
            .find(|(seen, _)| seen == image)
            .map(|(_, facts)| facts.clone())
    });
    if let Some(facts) = cached {
        return facts;
    }
    let facts = match crate::image::parse(image) {
        Ok(reference) => ImageFacts {
            error: None,
            digest: reference.digest.is_some(),
            latest: reference.tag == Some("latest"),
            tag_and_digest: crate::image::tag_and_digest(image),
        },
        Err(err) => ImageFacts {
            error: Some(err.to_string()),
            digest: false,
            latest: false,
            tag_and_digest: None,
        },
    };
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        if cache.len() == RECENT {
            cache.pop_front();
        }
        cache.push_back((image.to_owned(), facts.clone()));
    });
    facts
}

fn validate_env(spec: &AppServiceSpec, errors: &mut Vec<FieldError>) {
    if spec.env.len() > MAX_ENV {
        errors.push(FieldError::too_many("spec.env", spec.env.len(), MAX_ENV));
    }
    let database = spec.database.is_some();
    let mut seen = HashSet::new();
    for (i, var) in spec.env.iter().enumerate() {
        let field = format!("spec.env[{i}]");
        let name_field = format!("{field}.name");
        if var.name.is_empty() {
            errors.push(FieldError::required(&name_field, ""));
        } else if var.name.len() > MAX_ENV_NAME_LEN {
            errors.push(FieldError::too_long(&name_field, MAX_ENV_NAME_LEN));
        } else if !is_c_identifier(&var.name) {
            errors.push(FieldError::invalid_str(
                &name_field,
                &var.name,
                "a valid environment variable name must consist of alphabetic characters, digits or '_', and must not start with a digit (regex used for validation is '[A-Za-z_][A-Za-z0-9_]*')",
            ));
        } else if !seen.insert(var.name.as_str()) {
            errors.push(FieldError::duplicate(&name_field, &var.name));
        } else if database && var.name == DATABASE_URL_ENV {
            errors.push(FieldError::forbidden(
                &name_field,
                format!("{DATABASE_URL_ENV} is set by the operator when a database is requested"),
            ));
        }
        if let Some(value) = &var.value
            && value.len() > MAX_ENV_VALUE_LEN
        {
            errors.push(FieldError::too_long(
                format!("{field}.value"),
                MAX_ENV_VALUE_LEN,
            ));
        }
        if let Some(source) = &var.value_from {
            if var.value.as_deref().is_some_and(|v| !v.is_empty()) {
                errors.push(FieldError::invalid_str(
                    format!("{field}.valueFrom"),
                    "",
                    "may not be specified when `value` is not empty",
                ));
            }
            let sources = env_source_count(source);
            if sources != 1 {
                let detail = if sources == 0 {
                    "must specify one of: `configMapKeyRef`, `fieldRef`, `fileKeyRef`, `resourceFieldRef` or `secretKeyRef`"
                } else {
                    "may not have more than one field specified at a time"
                };
                errors.push(FieldError::invalid_str(
                    format!("{field}.valueFrom"),
                    "",
                    detail,
                ));
            }
        }
    }
}

/// `spec.expose`: 1 to 16 unique lowercase DNS host names (no wildcard, no IP address,
/// which the Gateway API refuses too), at most 16 unique path prefixes the Gateway API
/// accepts, a TCP port of `spec.ports`, and a Secret name.
fn validate_expose(
    spec: &AppServiceSpec,
    expose: &crate::types::ExposeSpec,
    errors: &mut Vec<FieldError>,
) {
    const FIELD: &str = "spec.expose";
    if expose.hostnames.is_empty() {
        errors.push(FieldError::required(
            format!("{FIELD}.hostnames"),
            "at least one host name is required",
        ));
    }
    if expose.hostnames.len() > MAX_EXPOSE_HOSTNAMES {
        errors.push(FieldError::too_many(
            format!("{FIELD}.hostnames"),
            expose.hostnames.len(),
            MAX_EXPOSE_HOSTNAMES,
        ));
    }
    let mut seen = HashSet::new();
    for (i, host) in expose.hostnames.iter().enumerate() {
        let field = format!("{FIELD}.hostnames[{i}]");
        if host.len() > MAX_SUBDOMAIN_LEN {
            errors.push(FieldError::too_long(field, MAX_SUBDOMAIN_LEN));
        } else if let Some(problem) = hostname_problem(host) {
            errors.push(FieldError::invalid_str(field, host, problem));
        } else if !seen.insert(host.as_str()) {
            errors.push(FieldError::duplicate(field, host));
        }
    }
    if expose.paths.len() > MAX_EXPOSE_PATHS {
        errors.push(FieldError::too_many(
            format!("{FIELD}.paths"),
            expose.paths.len(),
            MAX_EXPOSE_PATHS,
        ));
    }
    let mut seen = HashSet::new();
    for (i, path) in expose.paths.iter().enumerate() {
        let field = format!("{FIELD}.paths[{i}]");
        if path.len() > MAX_EXPOSE_PATH_LEN {
            errors.push(FieldError::too_long(field, MAX_EXPOSE_PATH_LEN));
        } else if let Some(problem) = path_prefix_problem(path) {
            errors.push(FieldError::invalid_str(field, path, problem));
        } else if !seen.insert(path.as_str()) {
            errors.push(FieldError::duplicate(field, path));
        }
    }
    if let Some(port) = expose.port.as_deref() {
        let ports = spec.ports();
        match ports.iter().find(|p| p.name == port) {
            None => errors.push(FieldError::invalid_str(
                format!("{FIELD}.port"),
                port,
                "must name a port of spec.ports",
            )),
            Some(p) if p.protocol.is_some_and(|p| p != crate::types::Protocol::Tcp) => {
                errors.push(FieldError::invalid_str(
                    format!("{FIELD}.port"),
                    port,
                    "must be a TCP port: HTTP requests are sent to it",
                ));
            }
            Some(_) => {}
        }
    } else if spec
        .ports()
        .first()
        .and_then(|p| p.protocol)
        .is_some_and(|p| p != crate::types::Protocol::Tcp)
    {
        errors.push(FieldError::required(
            format!("{FIELD}.port"),
            "the first port is not TCP: name the TCP port that receives HTTP requests",
        ));
    }
    if let Some(tls) = &expose.tls {
        if tls.secret_name.is_none() && tls.issuer_ref.is_none() {
            errors.push(FieldError::required(
                format!("{FIELD}.tls"),
                "secretName or issuerRef is required",
            ));
        }
        let names = [
            (
                "secretName",
                tls.secret_name.as_deref(),
                "the name of a Secret in the AppService's namespace",
            ),
            (
                "issuerRef.name",
                tls.issuer_ref.as_ref().map(|i| i.name.as_str()),
                "the name of an issuer",
            ),
        ];
        for (which, name, what) in names {
            let Some(name) = name else { continue };
            let field = format!("{FIELD}.tls.{which}");
            if name.len() > MAX_SUBDOMAIN_LEN {
                errors.push(FieldError::too_long(field, MAX_SUBDOMAIN_LEN));
            } else if !is_dns1123_subdomain(name) {
                errors.push(FieldError::invalid_str(
                    field,
                    name,
                    format!("must be a lowercase RFC 1123 subdomain ({what})"),
                ));
            }
        }
        if let Some(issuer) = &tls.issuer_ref
            && issuer.group.is_none()
            && let Some(kind) = issuer.kind.as_deref()
            && !matches!(kind, "Issuer" | "ClusterIssuer")
        {
            errors.push(FieldError::invalid_str(
                format!("{FIELD}.tls.issuerRef.kind"),
                kind,
                "must be Issuer or ClusterIssuer (or name the group of an external issuer)",
            ));
        }
    }
}

/// Why `host` cannot be an exposed host name, if it cannot.
fn hostname_problem(host: &str) -> Option<&'static str> {
    if host.starts_with('*') {
        return Some(
            "must not be a wildcard: a host name belongs to one AppService, and a wildcard would take others'",
        );
    }
    if host.parse::<std::net::Ipv4Addr>().is_ok() {
        return Some("must be a DNS name, not an IP address");
    }
    (!is_dns1123_subdomain(host))
        .then_some("must be a lowercase DNS name (RFC 1123): letters, digits, '-' and '.'")
}

/// Why `path` cannot be a path prefix of a route, if it cannot: the Gateway API's rules
/// (an absolute path of URI path characters and percent escapes, without `//`, `.` or
/// `..` segments, an escaped `/` or a fragment).
fn path_prefix_problem(path: &str) -> Option<&'static str> {
    if !path.starts_with('/') {
        return Some("must start with '/'");
    }
    let bytes = path.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let escape = path.get(i + 1..i + 3);
            match escape {
                Some(hex) if hex.bytes().all(|h| h.is_ascii_hexdigit()) => {
                    if hex.eq_ignore_ascii_case("2f") {
                        return Some("must not contain an escaped '/' (%2F)");
                    }
                    i += 3;
                    continue;
                }
                _ => return Some("'%' must start an escape of two hexadecimal digits"),
            }
        }
        if !(b.is_ascii_alphanumeric() || b"-/._~!$&'()*+,;=:@".contains(&b)) {
            return Some(
                "must contain only letters, digits, '-._~!$&'()*+,;=:@/' and percent escapes",
            );
        }
        i += 1;
    }
    if path.contains("//") {
        return Some("must not contain '//'");
    }
    if path
        .split('/')
        .any(|segment| segment == "." || segment == "..")
    {
        return Some("must not contain '.' or '..' segments");
    }
    None
}

/// `spec.autoscaling`: both bounds within the replicas' range, the least not above the
/// most, a target from 1% to 1000%; a CPU request to measure use against; and a canary
/// no larger than the least (the autoscaler may scale down to it).
fn validate_autoscaling(
    spec: &AppServiceSpec,
    autoscaling: &crate::types::AutoscalingSpec,
    errors: &mut Vec<FieldError>,
) {
    const FIELD: &str = "spec.autoscaling";
    let (min, max) = (autoscaling.min_replicas(), autoscaling.max_replicas);
    for (name, value) in [("minReplicas", min), ("maxReplicas", max)] {
        if !(MIN_AUTOSCALING_REPLICAS..=MAX_REPLICAS).contains(&value) {
            errors.push(FieldError::invalid_int(
                format!("{FIELD}.{name}"),
                value.into(),
                format!("must be between {MIN_AUTOSCALING_REPLICAS} and {MAX_REPLICAS}"),
            ));
        }
    }
    if min > max {
        errors.push(FieldError::invalid_int(
            format!("{FIELD}.minReplicas"),
            min.into(),
            format!("must not be greater than maxReplicas ({max})"),
        ));
    }
    let target = autoscaling.target_cpu_utilization();
    if !(MIN_TARGET_CPU_UTILIZATION..=MAX_TARGET_CPU_UTILIZATION).contains(&target) {
        errors.push(FieldError::invalid_int(
            format!("{FIELD}.targetCPUUtilizationPercentage"),
            target.into(),
            format!(
                "must be between {MIN_TARGET_CPU_UTILIZATION} and {MAX_TARGET_CPU_UTILIZATION}"
            ),
        ));
    }
    let cpu_request = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .is_some_and(|r| r.contains_key("cpu"));
    if !cpu_request {
        errors.push(FieldError::required(
            "spec.resources.requests.cpu",
            "required with spec.autoscaling: the autoscaler measures CPU use against it",
        ));
    }
    if let Some(canary) = &spec.canary
        && canary.replicas() > min
    {
        errors.push(FieldError::invalid_int(
            "spec.canary.replicas",
            canary.replicas().into(),
            format!("must not be greater than spec.autoscaling.minReplicas ({min}): the autoscaler may scale down to it"),
        ));
    }
}

/// `spec.config`: at most [`MAX_CONFIG_SOURCES`] entries, each exactly one ConfigMap or
/// Secret named as Kubernetes names them, read once as variables and once per mount path
/// at most; each mount path absolute, without `..`, not `/`, at most one entry's, and
/// never over the database CA's directory (nor it over one).
fn validate_config(spec: &AppServiceSpec, errors: &mut Vec<FieldError>) {
    if spec.config.len() > MAX_CONFIG_SOURCES {
        errors.push(FieldError::too_many(
            "spec.config",
            spec.config.len(),
            MAX_CONFIG_SOURCES,
        ));
    }
    let mut seen_env = HashSet::new();
    let mut seen_paths: Vec<&str> = Vec::new();
    for (i, entry) in spec.config.iter().enumerate() {
        let field = format!("spec.config[{i}]");
        for (name, which) in [(&entry.config_map, "configMap"), (&entry.secret, "secret")] {
            match name.as_deref() {
                Some(n) if n.len() > MAX_SUBDOMAIN_LEN => {
                    errors.push(FieldError::too_long(
                        format!("{field}.{which}"),
                        MAX_SUBDOMAIN_LEN,
                    ));
                }
                Some(n) if !is_dns1123_subdomain(n) => errors.push(FieldError::invalid_str(
                    format!("{field}.{which}"),
                    n,
                    "must be a lowercase RFC 1123 subdomain (the name of an object in the AppService's namespace)",
                )),
                _ => {}
            }
        }
        let Some((kind, name)) = entry.source() else {
            errors.push(FieldError::required(
                &field,
                "exactly one of configMap and secret must be set",
            ));
            continue;
        };
        match entry.mount_path.as_deref() {
            None => {
                if !seen_env.insert((kind, name)) {
                    errors.push(FieldError::duplicate(
                        format!("{field}.{}", config_field(kind)),
                        name,
                    ));
                }
            }
            Some(path) => {
                let path_field = format!("{field}.mountPath");
                if let Some(problem) = mount_path_problem(path) {
                    errors.push(FieldError::invalid_str(&path_field, path, problem));
                } else if seen_paths.contains(&path) {
                    errors.push(FieldError::duplicate(&path_field, path));
                } else {
                    seen_paths.push(path);
                }
            }
        }
    }
}

/// The field of `spec.config[]` that names an object of `kind`.
fn config_field(kind: crate::types::ConfigKind) -> &'static str {
    match kind {
        crate::types::ConfigKind::ConfigMap => "configMap",
        crate::types::ConfigKind::Secret => "secret",
    }
}

/// Why `path` cannot be where a `spec.config` entry's files are mounted, if it cannot.
fn mount_path_problem(path: &str) -> Option<&'static str> {
    let trimmed = path.trim_end_matches('/');
    if path.len() > MAX_MOUNT_PATH_LEN {
        Some("must be at most 512 characters")
    } else if !path.starts_with('/') {
        Some("must be an absolute path")
    } else if trimmed.is_empty() {
        Some("must not be the root directory")
    } else if path
        .split('/')
        .any(|segment| segment == ".." || segment == ".")
    {
        Some("must not contain '.' or '..' segments")
    } else if path.contains("//") || path.chars().any(|c| c.is_control() || c == ':') {
        Some("must not contain '//', ':' or control characters")
    } else if within(trimmed, DATABASE_CA_DIR) || within(DATABASE_CA_DIR, trimmed) {
        Some(
            "must not be or contain the database CA's directory (/var/run/secrets/platform.example.com/database)",
        )
    } else {
        None
    }
}

/// Whether `path` is `dir` or a path under it.
fn within(path: &str, dir: &str) -> bool {
    path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

fn env_source_count(source: &EnvVarSource) -> usize {
    [
        source.config_map_key_ref.is_some(),
        source.field_ref.is_some(),
        source.file_key_ref.is_some(),
        source.resource_field_ref.is_some(),
        source.secret_key_ref.is_some(),
    ]
    .into_iter()
    .filter(|set| *set)
    .count()
}

fn validate_resources(resources: &ResourceRequirements, errors: &mut Vec<FieldError>) {
    if resources.claims.as_ref().is_some_and(|c| !c.is_empty()) {
        errors.push(FieldError::forbidden(
            "spec.resources.claims",
            "resource claims are not supported by AppService",
        ));
    }
    let parse_all = |kind: &str,
                     list: Option<&std::collections::BTreeMap<String, Quantity>>,
                     errors: &mut Vec<FieldError>| {
        let mut parsed = Vec::new();
        let len = list.map_or(0, std::collections::BTreeMap::len);
        if len > crate::types::MAX_RESOURCE_ENTRIES {
            errors.push(FieldError::too_many(
                format!("spec.resources.{kind}"),
                len,
                crate::types::MAX_RESOURCE_ENTRIES,
            ));
            return parsed;
        }
        for (name, quantity) in list.into_iter().flatten() {
            let field = format!("spec.resources.{kind}[{name}]");
            match Amount::parse(quantity) {
                Ok(q) if q.is_negative() => {
                    errors.push(FieldError::invalid_str(
                        field,
                        &quantity.0,
                        "must be greater than or equal to 0",
                    ));
                }
                Ok(q) => parsed.push((name.clone(), q)),
                Err(e) => errors.push(FieldError::invalid_str(field, &quantity.0, e.to_string())),
            }
        }
        parsed
    };
    let requests = parse_all("requests", resources.requests.as_ref(), errors);
    let limits = parse_all("limits", resources.limits.as_ref(), errors);
    for (name, request) in &requests {
        if let Some((_, limit)) = limits.iter().find(|(n, _)| n == name)
            && request > limit
        {
            let raw = resources
                .requests
                .as_ref()
                .and_then(|r| r.get(name))
                .map(|q| q.0.as_str())
                .unwrap_or_default();
            let limit_raw = resources
                .limits
                .as_ref()
                .and_then(|l| l.get(name))
                .map(|q| q.0.as_str())
                .unwrap_or_default();
            errors.push(FieldError::invalid_str(
                format!("spec.resources.requests[{name}]"),
                raw,
                format!("must be less than or equal to {name} limit of {limit_raw}"),
            ));
        }
    }
}

fn validate_update(new: &AppServiceSpec, old: &AppServiceSpec, errors: &mut Vec<FieldError>) {
    if let (Some(old), Some(new)) = (&old.database, &new.database)
        && old.class != new.class
    {
        errors.push(FieldError::invalid_str(
            "spec.database.class",
            &new.class,
            "field is immutable while the database is enabled",
        ));
    }
}

/// An IANA service name, as Kubernetes requires of port names: at most 15 lowercase
/// letters, digits and '-', at least one letter, no '--', no '-' at either end.
pub fn is_iana_svc_name(s: &str) -> bool {
    (1..=MAX_PORT_NAME_LEN).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && s.chars().any(|c| c.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

/// `[A-Za-z_][A-Za-z0-9_]*`
pub fn is_c_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `[a-z]([-a-z0-9]*[a-z0-9])?`, at most [`MAX_LABEL_LEN`] characters.
pub fn is_dns1035_label(s: &str) -> bool {
    s.len() <= MAX_LABEL_LEN
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` (a DNS-1123 label), at most [`MAX_LABEL_LEN`]
/// characters.
pub fn is_dns1123_label(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=MAX_LABEL_LEN).contains(&s.len())
        && s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || c == '-')
}

/// Dot-separated DNS-1123 labels, at most [`crate::types::MAX_SUBDOMAIN_LEN`] characters.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= crate::types::MAX_SUBDOMAIN_LEN && s.split('.').all(is_dns1123_label)
}

#[cfg(test)]
#[path = "validation_tests.rs"]
mod tests;
