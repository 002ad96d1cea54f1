//! The Helm chart as it renders, with no cluster: `helm lint` and `helm template` in
//! every certificate mode, the values schema rejecting bad input, the Pods' security and
//! probes, the RBAC the controller uses and nothing more, the tenants' roles, the
//! admission policies' lists and the sharding and image-verification values.
//! `chart.rs` installs the chart into a real kube-apiserver.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the failure

mod chart_render;

use chart_render::*;
use std::collections::BTreeMap;

use serde_json::{Value, json};

#[test]
fn lint_passes_in_every_mode() {
    for mode in ["selfSigned", "certManager", "secret"] {
        let chart = chart_dir();
        let args = with_sets(
            &["lint", "--strict", chart.to_str().unwrap()],
            &mode_values(mode),
        );
        let (ok, stdout, stderr) = run_helm(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(ok, "helm lint ({mode}) failed:\n{stdout}\n{stderr}");
        assert!(stdout.contains("0 chart(s) failed"), "{stdout}");
    }
}

#[test]
fn the_crd_converts_through_the_release_webhook() {
    for mode in ["selfSigned", "certManager", "secret"] {
        let docs = template("appservice-system", &mode_values(mode));
        let crd = find(
            &docs,
            "CustomResourceDefinition",
            "appservices.platform.example.com",
        );
        // Which versions are served and which one is stored, in the CRD's order.
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Version {
            name: String,
            served: bool,
            storage: bool,
        }
        let versions: Vec<Version> =
            serde_json::from_value(crd["spec"]["versions"].clone()).expect("versions");
        let version = |name: &str, storage| Version {
            name: name.to_owned(),
            served: true,
            storage,
        };
        assert_eq!(
            versions,
            [version("v1beta1", true), version("v1alpha1", false)]
        );
        let conversion = &crd["spec"]["conversion"];
        assert_eq!(conversion["strategy"], "Webhook", "{mode}");
        assert_eq!(
            conversion["webhook"]["conversionReviewVersions"],
            serde_json::json!(["v1"])
        );
        let client = &conversion["webhook"]["clientConfig"];
        assert_eq!(client["service"]["path"], "/convert");
        assert_eq!(client["service"]["namespace"], "appservice-system");
        assert_eq!(client["service"]["port"], 443);
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"],
            "keep"
        );
        // The same CA as the admission webhooks, or cert-manager injects it.
        let mutating = find(
            &docs,
            "MutatingWebhookConfiguration",
            &format!("{RELEASE}-appservice-operator-webhook"),
        );
        match mode {
            "certManager" => {
                assert!(
                    crd["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].is_string()
                );
            }
            // The webhook injects it at run time; `helm template` renders none.
            "selfSigned" => {
                assert!(client.get("caBundle").is_none(), "{client}");
                assert!(
                    mutating["webhooks"][0]["clientConfig"]
                        .get("caBundle")
                        .is_none()
                );
            }
            _ => {
                assert_eq!(
                    client["caBundle"], mutating["webhooks"][0]["clientConfig"]["caBundle"],
                    "{mode}"
                );
                assert!(client["caBundle"].as_str().is_some_and(|b| !b.is_empty()));
            }
        }
        // Generated numbers survive the template's YAML round trip as integers.
        let ports = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["ports"];
        assert_eq!(ports["maxItems"], 16);
        assert_eq!(
            client["service"]["name"],
            mutating["webhooks"][0]["clientConfig"]["service"]["name"]
        );
    }
    let without = template("appservice-system", &["crd.install=false".to_owned()]);
    assert!(
        !without
            .iter()
            .any(|d| d["kind"] == "CustomResourceDefinition")
    );
}

#[test]
fn webhook_configurations_are_safe_by_default() {
    let docs = template("ops", &mode_values("selfSigned"));
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let hook = &find(&docs, kind, WEBHOOK)["webhooks"][0];
        assert_eq!(hook["failurePolicy"], "Fail", "{kind}");
        assert_eq!(hook["sideEffects"], "None", "{kind}");
        assert_eq!(hook["admissionReviewVersions"], json!(["v1"]), "{kind}");
        assert_eq!(hook["matchPolicy"], "Equivalent", "{kind}");
        let timeout = hook["timeoutSeconds"].as_i64().expect("timeoutSeconds");
        assert!((1..=10).contains(&timeout), "{kind}: timeout {timeout}");
        let excluded = &hook["namespaceSelector"]["matchExpressions"][0];
        assert_eq!(excluded["key"], "kubernetes.io/metadata.name");
        assert_eq!(excluded["operator"], "NotIn");
        assert_eq!(excluded["values"], json!(["kube-system", "ops"]), "{kind}");
        assert_eq!(hook["rules"][0]["operations"], json!(["CREATE", "UPDATE"]));
    }
    // The harness registers the chart's rules (one file, rendered here): a test sees the
    // write paths a cluster sends. /scale is validated; /status never is.
    let (mutating_rules, validating_rules) = harness::admission_rules().expect("rules");
    let rules = |kind: &str| find(&docs, kind, WEBHOOK)["webhooks"][0]["rules"].clone();
    assert_eq!(
        rules("MutatingWebhookConfiguration"),
        serde_json::to_value(&mutating_rules).unwrap()
    );
    assert_eq!(
        rules("ValidatingWebhookConfiguration"),
        serde_json::to_value(&validating_rules).unwrap()
    );
    assert_eq!(
        rules("ValidatingWebhookConfiguration")[0]["resources"],
        json!(["appservices", "appservices/scale"])
    );
    assert_eq!(
        rules("MutatingWebhookConfiguration")[0]["resources"],
        json!(["appservices"])
    );
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        assert_eq!(
            rules(kind)[0]["apiVersions"],
            json!(["v1alpha1", "v1beta1"]),
            "{kind}"
        );
    }
    let mutating = &find(&docs, "MutatingWebhookConfiguration", WEBHOOK)["webhooks"][0];
    assert_eq!(mutating["reinvocationPolicy"], "IfNeeded");
    assert_eq!(mutating["clientConfig"]["service"]["path"], "/mutate");
    let validating = &find(&docs, "ValidatingWebhookConfiguration", WEBHOOK)["webhooks"][0];
    assert_eq!(validating["clientConfig"]["service"]["path"], "/validate");

    let ignore = template("ops", &["webhook.failurePolicy=Ignore".to_owned()]);
    assert_eq!(
        find(&ignore, "ValidatingWebhookConfiguration", WEBHOOK)["webhooks"][0]["failurePolicy"],
        "Ignore"
    );
}

/// `helm template` (Argo CD, Flux post-renderers) gives the same bytes every time, in
/// every certificate mode: nothing random is rendered.
#[test]
fn helm_template_renders_the_same_bytes_twice_in_every_mode() {
    let chart = chart_dir();
    for mode in ["selfSigned", "certManager", "secret"] {
        let render = || {
            let args = with_sets(
                &[
                    "template",
                    RELEASE,
                    chart.to_str().unwrap(),
                    "--namespace",
                    "ops",
                ],
                &mode_values(mode),
            );
            let (ok, stdout, stderr) =
                run_helm(&args.iter().map(String::as_str).collect::<Vec<_>>());
            assert!(ok, "helm template ({mode}): {stderr}");
            stdout
        };
        let (first, second) = (render(), render());
        assert!(
            first.len() > 10_000,
            "{mode}: rendered {} bytes",
            first.len()
        );
        assert!(first == second, "{mode}: two renders differ");
        assert!(
            !first.contains("PRIVATE KEY"),
            "{mode}: a key in the rendered chart"
        );
    }
}

#[test]
fn certificate_modes_wire_the_ca_bundle() {
    // selfSigned: the webhook keeps its CA in a Secret the chart creates empty, issues
    // its serving certificate in memory (nothing mounted) and injects the caBundle.
    let docs = template("ops", &mode_values("selfSigned"));
    let secret = find(&docs, "Secret", &format!("{WEBHOOK}-ca"));
    assert_eq!(secret["type"], "Opaque");
    assert!(secret.get("data").is_none(), "{secret}");
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "Secret" && d["metadata"]["name"] == format!("{WEBHOOK}-tls")),
        "no Helm-made serving certificate"
    );
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        assert!(
            find(&docs, kind, WEBHOOK)["webhooks"][0]["clientConfig"]
                .get("caBundle")
                .is_none(),
            "{kind}"
        );
    }
    let pod = &find(&docs, "Deployment", WEBHOOK)["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], true);
    assert!(pod.get("volumes").is_none(), "{}", pod["volumes"]);
    let env: BTreeMap<String, Value> = pod["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e.get("value").cloned().unwrap_or(e["valueFrom"].clone()),
            )
        })
        .collect();
    assert_eq!(env["WEBHOOK_CA_SECRET"], format!("{WEBHOOK}-ca"));
    assert_eq!(
        env["WEBHOOK_CA_SECRET_NAMESPACE"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert_eq!(
        env["WEBHOOK_TLS_SANS"],
        format!("{WEBHOOK},{WEBHOOK}.ops,{WEBHOOK}.ops.svc,{WEBHOOK}.ops.svc.cluster.local")
    );
    assert_eq!(
        env["WEBHOOK_CA_BUNDLE_TARGETS"],
        format!("mutating/{WEBHOOK},validating/{WEBHOOK},crd/appservices.platform.example.com")
    );
    assert_eq!(env["WEBHOOK_CA_VALIDITY_DAYS"], "3650");
    assert!(!env.contains_key("WEBHOOK_TLS_CERT"));
    // Its RBAC: its CA Secret by name (create is confined by the admission policy),
    // and patch on exactly the release's configurations and CRD.
    let role = find(&docs, "Role", &format!("{WEBHOOK}-ca"));
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [format!("{WEBHOOK}-ca")], "verbs": ["get", "list", "watch", "update"]},
        ])
    );
    let bundle_role = find(&docs, "ClusterRole", &format!("{WEBHOOK}-ca-bundle"));
    assert_eq!(bundle_role["rules"][0]["resourceNames"], json!([WEBHOOK]));
    assert_eq!(
        bundle_role["rules"][1]["resourceNames"],
        json!(["appservices.platform.example.com"])
    );
    let policy = find(
        &docs,
        "ValidatingAdmissionPolicy",
        &format!("{WEBHOOK}-ca-secret"),
    );
    assert_eq!(
        policy["spec"]["validations"][0]["expression"],
        format!("request.namespace == 'ops' && request.name == '{WEBHOOK}-ca'")
    );
    // A CRD managed elsewhere is not the webhook's to patch.
    let no_crd = template("ops", &["crd.install=false".to_owned()]);
    let bundle_role = find(&no_crd, "ClusterRole", &format!("{WEBHOOK}-ca-bundle"));
    assert_eq!(bundle_role["rules"].as_array().unwrap().len(), 1);

    // certManager: a Certificate for the Service names, CA injected by cert-manager.
    let docs = template("ops", &mode_values("certManager"));
    let cert = find(&docs, "Certificate", WEBHOOK);
    assert_eq!(cert["spec"]["secretName"], format!("{WEBHOOK}-tls"));
    let names = cert["spec"]["dnsNames"].as_array().expect("dnsNames");
    assert!(
        names.contains(&json!(format!("{WEBHOOK}.ops.svc"))),
        "{names:?}"
    );
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let obj = find(&docs, kind, WEBHOOK);
        assert_eq!(
            obj["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            format!("ops/{WEBHOOK}")
        );
        assert!(
            obj["webhooks"][0]["clientConfig"].get("caBundle").is_none(),
            "{kind}"
        );
    }
    assert!(
        !docs.iter().any(|d| d["kind"] == "Secret"),
        "cert-manager owns the Secret"
    );
    let pod = &find(&docs, "Deployment", WEBHOOK)["spec"]["template"]["spec"];
    assert_eq!(
        pod["automountServiceAccountToken"], true,
        "the AppService watch (scale writes) needs a token in every mode"
    );
    assert_eq!(
        pod["volumes"][0]["secret"]["secretName"],
        format!("{WEBHOOK}-tls")
    );
    let own_issuer = template("ops", &{
        let mut v = mode_values("certManager");
        v.push("certificates.certManager.issuerRef.name=corp-ca".into());
        v.push("certificates.certManager.issuerRef.kind=ClusterIssuer".into());
        v
    });
    assert_eq!(
        find(&own_issuer, "Certificate", WEBHOOK)["spec"]["issuerRef"]["kind"],
        "ClusterIssuer"
    );
    assert!(
        !own_issuer.iter().any(|d| d["kind"] == "Issuer"),
        "no chart-made issuer with issuerRef"
    );

    // secret: the user's Secret is mounted and their CA is the bundle.
    let docs = template("ops", &mode_values("secret"));
    let bundle = find(&docs, "ValidatingWebhookConfiguration", WEBHOOK)["webhooks"][0]["clientConfig"]["caBundle"]
        .as_str()
        .expect("caBundle");
    assert!(!bundle.is_empty());
    let volumes = &find(&docs, "Deployment", WEBHOOK)["spec"]["template"]["spec"]["volumes"];
    assert_eq!(volumes[0]["secret"]["secretName"], "my-webhook-tls");
    assert!(!docs.iter().any(|d| d["kind"] == "Secret"));
}

#[test]
fn schema_and_required_values_reject_bad_input() {
    let cases: &[(&[&str], &str)] = &[
        (&["webhook.replicas=two"], "/webhook/replicas"),
        (
            &["webhook.failurePolicy=Sometimes"],
            "/webhook/failurePolicy",
        ),
        (&["webhook.timeoutSeconds=60"], "/webhook/timeoutSeconds"),
        (&["certificates.mode=vault"], "/certificates/mode"),
        (&["controler.replicas=2"], "controler"),
        (
            &["controller.leaseDuration=soon"],
            "/controller/leaseDuration",
        ),
        (&["image.pullPolicy=Sometimes"], "/image/pullPolicy"),
        (&["certificates.mode=secret"], "certificates.existingSecret"),
        (
            &["certificates.mode=secret", "certificates.existingSecret=x"],
            "certificates.caBundle",
        ),
        (
            &["controller.expose.gateway.name=public"],
            "controller.expose.gateway needs both namespace and name",
        ),
        (
            &[
                "controller.expose.gateway.namespace=Gateways",
                "controller.expose.gateway.name=public",
            ],
            "/controller/expose/gateway/namespace",
        ),
    ];
    for (sets, expected) in cases {
        let stderr = template_refused(sets);
        assert!(
            stderr.contains(expected),
            "{sets:?}: expected {expected:?} in: {stderr}"
        );
    }
}

#[test]
fn pods_are_restricted_and_probed() {
    let docs = template("ops", &[]);
    for name in [WEBHOOK, CONTROLLER] {
        let deploy = find(&docs, "Deployment", name);
        assert_eq!(deploy["spec"]["replicas"], 2, "{name}");
        let pod = &deploy["spec"]["template"]["spec"];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{name}"
        );
        let container = &pod["containers"][0];
        let sc = &container["securityContext"];
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{name}");
        assert_eq!(
            container["livenessProbe"]["httpGet"]["path"], "/healthz",
            "{name}"
        );
        assert_eq!(
            container["readinessProbe"]["httpGet"]["path"], "/readyz",
            "{name}"
        );
        assert!(
            container["resources"]["requests"]["cpu"].is_string(),
            "{name}"
        );
        assert!(
            container["resources"]["limits"]["memory"].is_string(),
            "{name}"
        );
        assert_eq!(
            find(&docs, "PodDisruptionBudget", name)["spec"]["maxUnavailable"],
            1,
            "{name}"
        );
    }
    let webhook = &find(&docs, "Deployment", WEBHOOK)["spec"]["template"]["spec"];
    // A token to watch AppServices (scale writes are judged on them) and to keep its CA
    // (selfSigned, the default); see certificate_modes_wire_the_ca_bundle.
    assert_eq!(webhook["automountServiceAccountToken"], true);
    assert!(webhook["topologySpreadConstraints"].is_array());
    let env =
        &find(&docs, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]["env"];
    let pod_name = env
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == "POD_NAME"))
        .expect("POD_NAME");
    assert_eq!(
        pod_name["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
}

#[test]
fn webhook_shutdown_and_limits_match_the_grace_period() {
    let docs = template("ops", &[]);
    let pod = &find(&docs, "Deployment", WEBHOOK)["spec"]["template"]["spec"];
    // Delay (5) + drain (20) + margin (5): the kubelet waits for the whole shutdown.
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);
    let env = pod["containers"][0]["env"].as_array().expect("env");
    let value = |name: &str| {
        env.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing"))["value"]
            .clone()
    };
    assert_eq!(value("WEBHOOK_SHUTDOWN_DELAY"), "5s");
    assert_eq!(value("WEBHOOK_SHUTDOWN_TIMEOUT"), "20s");
    assert_eq!(value("WEBHOOK_MAX_CONNECTIONS"), "1024");
    assert_eq!(value("WEBHOOK_MAX_IN_FLIGHT_BYTES"), "12582912");
    assert_eq!(value("WEBHOOK_MAX_CONVERT_BODY_BYTES"), "8388608");
    assert_eq!(value("WEBHOOK_MAX_CONNECTIONS_PER_PEER"), "128");
    assert_eq!(value("WEBHOOK_BODY_TIMEOUT"), "2s");
    assert_eq!(value("WEBHOOK_IDLE_TIMEOUT"), "30s");
    // Every review is answered before the API server gives up on it.
    let timeout = |docs: &[Value]| {
        find(docs, "ValidatingWebhookConfiguration", WEBHOOK)["webhooks"][0]["timeoutSeconds"]
            .as_i64()
            .expect("timeoutSeconds")
    };
    assert_eq!(timeout(&docs), 5);
    assert_eq!(value("WEBHOOK_REQUEST_TIMEOUT"), "4s");
    let longer = template(
        "ops",
        &[
            "webhook.shutdownDelaySeconds=15".to_owned(),
            "webhook.drainSeconds=40".to_owned(),
            "webhook.timeoutSeconds=10".to_owned(),
        ],
    );
    let pod = &find(&longer, "Deployment", WEBHOOK)["spec"]["template"]["spec"];
    assert_eq!(pod["terminationGracePeriodSeconds"], 60);
    assert_eq!(timeout(&longer), 10);
    let env = pod["containers"][0]["env"].as_array().expect("env");
    assert!(
        env.iter()
            .any(|v| v["name"] == "WEBHOOK_REQUEST_TIMEOUT" && v["value"] == "9s"),
        "{env:?}"
    );
}

#[test]
fn storage_migration_is_an_opt_in_post_upgrade_hook() {
    let docs = template("ops", &[]);
    assert!(
        !docs.iter().any(|d| d["metadata"]["name"] == MIGRATE),
        "rendered without storageMigration.enabled"
    );
    let docs = template("ops", &["storageMigration.enabled=true".to_owned()]);
    let job = find(&docs, "Job", MIGRATE);
    assert_eq!(
        job["metadata"]["annotations"]["helm.sh/hook"],
        "post-upgrade"
    );
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], MIGRATE);
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(
        pod["containers"][0]["command"],
        json!(["/usr/local/bin/appservice-migrate-storage"])
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    // Its ServiceAccount and RBAC are hooks too, created before the Job.
    for kind in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"] {
        let doc = find(&docs, kind, MIGRATE);
        assert_eq!(
            doc["metadata"]["annotations"]["helm.sh/hook"], "post-upgrade",
            "{kind}"
        );
        assert_eq!(
            doc["metadata"]["annotations"]["helm.sh/hook-weight"], "-10",
            "{kind}"
        );
    }
}

#[test]
fn rbac_is_exactly_what_the_controller_uses() {
    let docs = template("ops", &[]);
    let role = find(&docs, "ClusterRole", CONTROLLER);
    let rules: Vec<(String, String, String)> = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .flat_map(|r| {
            let groups = r["apiGroups"].as_array().cloned().unwrap_or_default();
            let resources = r["resources"].as_array().cloned().unwrap_or_default();
            let verbs = r["verbs"].as_array().cloned().unwrap_or_default();
            let mut out = vec![];
            for g in &groups {
                for res in &resources {
                    let verbs: Vec<&str> = verbs.iter().filter_map(Value::as_str).collect();
                    out.push((
                        g.as_str().unwrap_or("?").to_owned(),
                        res.as_str().unwrap_or("?").to_owned(),
                        verbs.join(","),
                    ));
                }
            }
            out
        })
        .collect();
    let expected = vec![
        (
            "platform.example.com",
            "appservices",
            "get,list,watch,patch",
        ),
        ("platform.example.com", "appservices/status", "get,patch"),
        ("platform.example.com", "appservices/finalizers", "update"),
        // delete: the canary Deployment once promoted or aborted.
        ("apps", "deployments", "get,list,watch,create,patch,delete"),
        ("", "services", "get,list,watch,create,patch"),
        // delete: the budget of an AppService scaled below two Pods.
        (
            "policy",
            "poddisruptionbudgets",
            "get,list,watch,create,patch,delete",
        ),
        // delete: the autoscaler once spec.autoscaling is removed.
        (
            "autoscaling",
            "horizontalpodautoscalers",
            "get,list,watch,create,patch,delete",
        ),
        // The ConfigMaps the Pods read (spec.config, env): a change rolls them.
        ("", "configmaps", "get,list,watch"),
        // Why a rollout's Pods do not start (the kubelet's waiting reason, in status).
        ("", "pods", "list"),
        ("events.k8s.io", "events", "create,patch"),
        // The `<name>-database` Secrets, watched (metadata, by label) to heal them.
        ("", "secrets", "get,list,watch,create,update,delete"),
    ];
    let expected: Vec<(String, String, String)> = expected
        .into_iter()
        .map(|(a, b, c)| (a.to_owned(), b.to_owned(), c.to_owned()))
        .collect();
    assert_eq!(rules, expected);
    assert!(
        !serde_json::to_string(&docs).unwrap().contains("\"*\""),
        "no wildcard anywhere"
    );

    // DatabaseClasses: read one by name, write its status, read a namespace's labels
    // (a class's allowedNamespaces.selector); nothing else.
    assert_eq!(
        find(
            &docs,
            "ClusterRole",
            &format!("{CONTROLLER}-databaseclasses")
        )["rules"],
        json!([
            {"apiGroups": ["platform.example.com"], "resources": ["databaseclasses"], "verbs": ["get"]},
            {"apiGroups": ["platform.example.com"], "resources": ["databaseclasses/status"], "verbs": ["patch"]},
            // list + watch: image verification caches the namespaces' labels (a
            // policy's namespaceSelector) and the ImagePolicies.
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["platform.example.com"], "resources": ["imagepolicies"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["platform.example.com"], "resources": ["imagepolicies/status"], "verbs": ["patch"]},
        ])
    );
    // Without image verification: a namespace is only read by name, no policy at all.
    let off = template(
        "ops",
        &["controller.imageVerification.enabled=false".to_owned()],
    );
    assert_eq!(
        find(
            &off,
            "ClusterRole",
            &format!("{CONTROLLER}-databaseclasses")
        )["rules"],
        json!([
            {"apiGroups": ["platform.example.com"], "resources": ["databaseclasses"], "verbs": ["get"]},
            {"apiGroups": ["platform.example.com"], "resources": ["databaseclasses/status"], "verbs": ["patch"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
        ])
    );
    // The classes' CA ConfigMaps: only in the release namespace.
    let admin_role = find(&docs, "Role", &format!("{CONTROLLER}-database-admin"));
    assert_eq!(admin_role["metadata"]["namespace"], "ops");
    assert_eq!(
        admin_role["rules"],
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}])
    );

    // Leases: only in the release namespace, and only the one named Lease can be changed.
    let lease_role = find(&docs, "Role", &format!("{CONTROLLER}-leader-election"));
    assert_eq!(lease_role["metadata"]["namespace"], "ops");
    assert_eq!(
        lease_role["rules"][1]["resourceNames"],
        json!(["appservice-controller"])
    );

    // The webhook may only list/watch AppServices (the cache scale writes are judged
    // on); when policies may read namespace labels, list/watch on namespaces too.
    let watch_apps = json!({"apiGroups": ["platform.example.com"], "resources": ["appservices"], "verbs": ["list", "watch"]});
    assert_eq!(
        find(&docs, "ClusterRole", WEBHOOK)["rules"],
        json!([watch_apps])
    );
    let labels = template("ops", &["webhook.namespaceLabels=true".to_owned()]);
    assert_eq!(
        find(&labels, "ClusterRole", WEBHOOK)["rules"],
        json!([watch_apps, {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}])
    );
    let pod = &find(&labels, "Deployment", WEBHOOK)["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], true);
    assert!(
        pod["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "WEBHOOK_NAMESPACE_LABELS")
    );

    let scoped = template("ops", &["controller.watchNamespace=team-a".to_owned()]);
    // Scoped to one namespace: the controller's only cluster-wide rights are on
    // DatabaseClasses, which are cluster-scoped objects (the webhook's are on its own
    // cluster-scoped configurations, see certificate_modes_wire_the_ca_bundle, and its
    // list/watch of AppServices, checked above, which stays cluster-wide: it judges
    // writes in every namespace its configurations cover).
    let classes = format!("{CONTROLLER}-databaseclasses");
    assert!(!scoped.iter().any(|d| {
        (d["kind"] == "ClusterRole" || d["kind"] == "ClusterRoleBinding")
            && d["metadata"]["labels"]["app.kubernetes.io/component"] == "controller"
            && d["metadata"]["name"] != classes.as_str()
    }));
    // The tenant roles are ClusterRoles too, but bound to no one by the chart: they only
    // add to Kubernetes' view/edit/admin (tenant_roles_aggregate_to_the_default_roles...).
    let cluster_wide: Vec<&Value> = scoped
        .iter()
        .filter(|d| d["kind"] == "ClusterRole")
        .map(|d| &d["metadata"]["name"])
        .collect();
    assert_eq!(
        cluster_wide,
        [
            &json!(classes),
            &json!(format!("{RELEASE}-appservice-operator-view")),
            &json!(format!("{RELEASE}-appservice-operator-edit")),
            &json!(WEBHOOK),
            &json!(format!("{WEBHOOK}-ca-bundle"))
        ],
        "no other ClusterRole"
    );
    assert_eq!(
        find(&scoped, "ClusterRole", WEBHOOK)["rules"],
        find(&docs, "ClusterRole", WEBHOOK)["rules"]
    );
    assert_eq!(
        find(&scoped, "Role", &format!("{CONTROLLER}-database-admin"))["rules"],
        json!([{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get"]}])
    );
    assert_eq!(
        find(&scoped, "Role", CONTROLLER)["metadata"]["namespace"],
        "team-a"
    );
}

#[test]
fn the_controllers_admission_policy_and_flag_share_one_list() {
    let docs = template(
        "ops",
        &["controller.excludeNamespaces={team-x,team-y}".to_owned()],
    );
    let policy = find(&docs, "ValidatingAdmissionPolicy", OWNED_POLICY);
    let binding = find(&docs, "ValidatingAdmissionPolicyBinding", OWNED_POLICY);
    assert_eq!(binding["spec"]["policyName"], OWNED_POLICY);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    // Only the controller's ServiceAccount is confined.
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        format!("request.userInfo.username == 'system:serviceaccount:ops:{CONTROLLER}'")
    );
    let rules = &policy["spec"]["matchConstraints"]["resourceRules"];
    assert_eq!(rules[0]["resources"], json!(["deployments"]));
    assert_eq!(rules[1]["resources"], json!(["services", "secrets"]));
    assert_eq!(rules[2]["resources"], json!(["poddisruptionbudgets"]));
    assert_eq!(rules[3]["resources"], json!(["horizontalpodautoscalers"]));
    for rule in rules.as_array().unwrap() {
        assert_eq!(rule["operations"], json!(["CREATE", "UPDATE", "DELETE"]));
    }
    // The namespaces the policy refuses are those the controller is told to skip.
    let env =
        find(&docs, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .clone();
    let flag = env
        .iter()
        .find(|e| e["name"] == "EXCLUDE_NAMESPACES")
        .expect("EXCLUDE_NAMESPACES")["value"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(flag, "kube-system,ops,team-x,team-y");
    let listed: Vec<String> = flag.split(',').map(|n| format!("\"{n}\"")).collect();
    assert_eq!(
        policy["spec"]["validations"][0]["expression"],
        format!("!(request.namespace in [{}])", listed.join(","))
    );
    // Off on request (e.g. a cluster whose admins manage policies elsewhere).
    let off = template("ops", &["admissionPolicies.enabled=false".to_owned()]);
    assert!(!off.iter().any(|d| d["kind"] == "ValidatingAdmissionPolicy"
        || d["kind"] == "ValidatingAdmissionPolicyBinding"));
}

/// The NetworkPolicy is rendered by default and admits to the webhook port exactly the
/// API server's addresses and peers set in values; under `helm template` without them
/// (nothing can be looked up), the rule has no `from` (any source, the notes warn).
#[test]
fn the_webhook_port_admits_only_the_api_server_by_default() {
    let docs = template("ops", &[]);
    assert_eq!(webhook_port_peers(&docs), Value::Null);
    let policy = find(&docs, "NetworkPolicy", WEBHOOK);
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    let set = template(
        "ops",
        &[
            "networkPolicy.apiServerCidrs={10.0.0.0/28,fd00::/64}".to_owned(),
            "networkPolicy.apiServerPeers[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=kube-system".to_owned(),
            "networkPolicy.apiServerPeers[0].podSelector.matchLabels.app=konnectivity-agent".to_owned(),
        ],
    );
    assert_eq!(
        webhook_port_peers(&set),
        json!([
            {"ipBlock": {"cidr": "10.0.0.0/28"}},
            {"ipBlock": {"cidr": "fd00::/64"}},
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
             "podSelector": {"matchLabels": {"app": "konnectivity-agent"}}},
        ])
    );
    let off = template("ops", &["networkPolicy.enabled=false".to_owned()]);
    assert!(!off.iter().any(|d| d["kind"] == "NetworkPolicy"));
}

/// `webhook.clientCA.configMap` mounts that ConfigMap's CA and passes it as
/// `--client-ca`; without it nothing is mounted and no client certificate is needed.
#[test]
fn a_client_ca_is_mounted_and_required_when_named() {
    let env_of = |docs: &[Value]| {
        find(docs, "Deployment", WEBHOOK)["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .expect("env")
            .clone()
    };
    let docs = template("ops", &[]);
    assert!(
        !env_of(&docs)
            .iter()
            .any(|v| v["name"] == "WEBHOOK_CLIENT_CA")
    );
    let docs = template(
        "ops",
        &[
            "webhook.clientCA.configMap=apiserver-client-ca".to_owned(),
            "webhook.clientCA.key=client-ca.pem".to_owned(),
        ],
    );
    let env = env_of(&docs);
    let ca = env
        .iter()
        .find(|v| v["name"] == "WEBHOOK_CLIENT_CA")
        .expect("WEBHOOK_CLIENT_CA");
    assert_eq!(ca["value"], "/etc/webhook/client-ca/ca.crt");
    let pod = &find(&docs, "Deployment", WEBHOOK)["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "client-ca")
        .expect("the client-ca volume");
    assert_eq!(
        volume["configMap"],
        json!({"name": "apiserver-client-ca", "items": [{"key": "client-ca.pem", "path": "ca.crt"}]})
    );
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "client-ca")
        .expect("the client-ca mount");
    assert_eq!(mount["mountPath"], "/etc/webhook/client-ca");
}

#[test]
fn tenant_roles_aggregate_to_the_default_roles_and_grant_no_status_or_classes() {
    let docs = template("ops", &[]);
    let view = find(&docs, "ClusterRole", "aso-appservice-operator-view");
    let edit = find(&docs, "ClusterRole", "aso-appservice-operator-edit");
    let label = |role: &Value, to: &str| {
        role["metadata"]["labels"][format!("rbac.authorization.k8s.io/aggregate-to-{to}")]
            == json!("true")
    };
    assert!(label(view, "view") && label(view, "edit") && label(view, "admin"));
    assert!(!label(edit, "view") && label(edit, "edit") && label(edit, "admin"));
    for role in [view, edit] {
        let text = serde_json::to_string(&role["rules"]).unwrap();
        assert!(!text.contains("databaseclasses"), "{text}");
        assert!(!text.contains("secrets"), "{text}");
    }
    // The chart binds them to no one: who gets them is the platform's RoleBindings.
    assert!(!docs.iter().any(|d| {
        d["roleRef"]["name"]
            .as_str()
            .is_some_and(|n| n.ends_with("-view") || n.ends_with("-edit"))
    }));
    // Status is read with the object, never written by a tenant.
    let edit_rules = serde_json::to_string(&edit["rules"]).unwrap();
    assert!(!edit_rules.contains("appservices/status"), "{edit_rules}");

    // Values of a release from before the roles (an upgrade with --reuse-values): on.
    let old_values = template("ops", &["tenantRbac=null".to_owned()]);
    find(&old_values, "ClusterRole", "aso-appservice-operator-edit");

    // Platforms that write their own roles turn them off.
    let off = template(
        "ops",
        &["tenantRbac.aggregateToDefaultRoles=false".to_owned()],
    );
    assert!(
        !off.iter().any(|d| d["kind"] == "ClusterRole"
            && d["metadata"]["labels"]
                .as_object()
                .is_some_and(|l| l.keys().any(|k| k.contains("aggregate-to-")))),
        "no aggregated role when turned off"
    );
}

#[test]
fn sharding_is_off_by_default_and_on_adds_its_flags_and_rbac() {
    let env_names = |docs: &[Value]| -> Vec<String> {
        find(docs, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .expect("env")
            .iter()
            .filter_map(|e| e["name"].as_str().map(str::to_owned))
            .collect()
    };
    let lease_rules = |docs: &[Value]| -> Vec<Value> {
        find(docs, "Role", &format!("{CONTROLLER}-leader-election"))["rules"]
            .as_array()
            .expect("rules")
            .clone()
    };
    let off = template("ops", &[]);
    assert!(!env_names(&off).iter().any(|n| n.starts_with("SHARD")));
    assert_eq!(lease_rules(&off).len(), 2, "only the leader Lease");

    let on = template(
        "ops",
        &[
            "controller.sharding.enabled=true".into(),
            "controller.sharding.ring=blue".into(),
        ],
    );
    let env =
        &find(&on, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]["env"];
    let value = |name: &str| {
        env.as_array()
            .and_then(|e| e.iter().find(|v| v["name"] == name))
            .map(|v| v["value"].clone())
    };
    assert_eq!(value("SHARDING"), Some(json!("true")));
    // The verb the shard-labels admission policy asks for, only with sharding.
    let app_verbs =
        |docs: &[Value]| find(docs, "ClusterRole", CONTROLLER)["rules"][0]["verbs"].clone();
    assert_eq!(
        app_verbs(&on),
        json!(["get", "list", "watch", "patch", "shard"])
    );
    assert_eq!(app_verbs(&off), json!(["get", "list", "watch", "patch"]));
    assert_eq!(value("SHARD_RING"), Some(json!("blue")));
    // The member filters its watches unless the server-side sharded watch is asked for.
    assert_eq!(value("SHARDED_WATCH"), None);
    // It combines with a namespace selector (a canary ring): buckets inside the ring,
    // the selector between rings.
    let watch = template(
        "ops",
        &[
            "controller.sharding.enabled=true".into(),
            "controller.sharding.shardedWatch=true".into(),
            "controller.sharding.namespaceSelector[0].key=operator-upgrade".into(),
            "controller.sharding.namespaceSelector[0].operator=Exists".into(),
            "controller.sharding.peerReleaseNamespaces[0]=appservice-system".into(),
        ],
    );
    assert!(env_names(&watch).contains(&"SHARDED_WATCH".to_owned()));
    assert!(env_names(&watch).contains(&"NAMESPACE_SELECTOR".to_owned()));
    // Alone, no other release's Leases are read anywhere, and the namespaces are
    // watched (each ring serves those its selector matches and no other ring's does).
    assert_eq!(value("PEER_LEASE_NAMESPACES"), None);
    assert!(
        !on.iter()
            .any(|d| d["metadata"]["name"] == format!("{CONTROLLER}-shard-peers"))
    );
    assert_eq!(
        find(&on, "ClusterRole", &format!("{CONTROLLER}-databaseclasses"))["rules"][2],
        json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]})
    );
    let rules = lease_rules(&on);
    assert!(
        rules.iter().any(|r| r["resourceNames"].is_null()
            && r["verbs"] == json!(["get", "list", "watch", "update", "delete"])),
        "membership Leases: {rules:?}"
    );
}

/// Exposure is off until the admin names a Gateway: then the controller gets its flag,
/// the RBAC for HTTPRoutes, and the owned-objects policy covers HTTPRoutes too.
#[test]
fn a_named_gateway_turns_exposure_on_with_its_rbac_and_policy() {
    let route_rules = |docs: &[Value]| -> Vec<Value> {
        find(docs, "ClusterRole", CONTROLLER)["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter(|r| r["apiGroups"] == json!(["gateway.networking.k8s.io"]))
            .cloned()
            .collect()
    };
    let policy_rules = |docs: &[Value]| -> Vec<Value> {
        find(docs, "ValidatingAdmissionPolicy", OWNED_POLICY)["spec"]["matchConstraints"]
            ["resourceRules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter(|r| r["apiGroups"] == json!(["gateway.networking.k8s.io"]))
            .cloned()
            .collect()
    };
    let flag = |docs: &[Value]| {
        find(docs, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .and_then(|e| e.iter().find(|v| v["name"] == "EXPOSE_GATEWAY"))
            .map(|v| v["value"].clone())
    };
    let off = template("ops", &[]);
    assert_eq!(flag(&off), None);
    assert!(route_rules(&off).is_empty());
    assert!(policy_rules(&off).is_empty());

    let on = template(
        "ops",
        &[
            "controller.expose.gateway.namespace=gateways".into(),
            "controller.expose.gateway.name=public".into(),
        ],
    );
    assert_eq!(flag(&on), Some(json!("gateways/public")));
    assert_eq!(
        route_rules(&on),
        [
            json!({"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes", "referencegrants"],
            "verbs": ["get", "list", "watch", "create", "patch", "delete"]})
        ]
    );
    assert_eq!(
        policy_rules(&on),
        [
            json!({"apiGroups": ["gateway.networking.k8s.io"], "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["httproutes", "referencegrants"]})
        ]
    );
    // The Gateway itself: read, and patched (its HTTPS listeners), that one only.
    let role = find(&on, "Role", &format!("{CONTROLLER}-gateway"));
    assert_eq!(role["metadata"]["namespace"], "gateways");
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["gateways"],
             "resourceNames": ["public"], "verbs": ["get", "patch"]},
            {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["gateways"],
             "verbs": ["list", "watch"]},
        ])
    );
    let binding = find(&on, "RoleBinding", &format!("{CONTROLLER}-gateway"));
    assert_eq!(binding["subjects"][0]["namespace"], "ops");
    assert_eq!(
        find(&on, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .and_then(|e| e.iter().find(|v| v["name"] == "EXPOSE_HTTPS_PORT"))
            .map(|v| v["value"].clone()),
        Some(json!("443"))
    );
    assert!(
        !off.iter()
            .any(|d| d["metadata"]["name"] == format!("{CONTROLLER}-gateway"))
    );
    // cert-manager: its Certificates, only when asked for.
    let certificates = |docs: &[Value]| -> bool {
        find(docs, "ClusterRole", CONTROLLER)["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .any(|r| r["apiGroups"] == json!(["cert-manager.io"]))
    };
    assert!(!certificates(&on));
    let with_cm = template(
        "ops",
        &[
            "controller.expose.gateway.namespace=gateways".into(),
            "controller.expose.gateway.name=public".into(),
            "controller.expose.certManager=true".into(),
        ],
    );
    assert!(certificates(&with_cm));
    // Without the Gateway API: Ingresses of the named class, unless a Gateway is named.
    let ingress = template(
        "ops",
        &["controller.expose.ingressClassName=traefik".into()],
    );
    let ingress_rules = |docs: &[Value]| -> Vec<Value> {
        find(docs, "ClusterRole", CONTROLLER)["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .filter(|r| r["apiGroups"] == json!(["networking.k8s.io"]))
            .cloned()
            .collect()
    };
    assert_eq!(
        ingress_rules(&ingress),
        [
            json!({"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"],
            "verbs": ["get", "list", "watch", "create", "patch", "delete"]})
        ]
    );
    assert!(ingress_rules(&on).is_empty());
    let env_of = |docs: &[Value], name: &str| {
        find(docs, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .and_then(|e| e.iter().find(|v| v["name"] == name))
            .map(|v| v["value"].clone())
    };
    assert_eq!(
        env_of(&ingress, "EXPOSE_INGRESS_CLASS"),
        Some(json!("traefik"))
    );
    assert_eq!(env_of(&on, "EXPOSE_INGRESS_CLASS"), None);
    let policy = &find(&with_cm, "ValidatingAdmissionPolicy", OWNED_POLICY)["spec"]["matchConstraints"]
        ["resourceRules"];
    assert!(
        policy
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["resources"] == json!(["certificates"]))
    );
}

/// A canary release and the main one split the namespaces: the chart turns
/// `controller.sharding.namespaceSelector` into the controller's `--namespace-selector`
/// (which the controller's own parser reads back to the same split), gives the webhook
/// configurations the same selector, and adds the RBAC the rings then need (the member
/// Leases of the named peer releases, read only and only there; the namespaces' labels).
#[test]
fn a_namespace_split_renders_the_same_selector_for_the_controller_and_the_webhook() {
    // A split that names no peer release reads the member Leases of every namespace, so
    // the two rings always see each other.
    let unnamed = template(
        "ops",
        &[
            "controller.sharding.enabled=true".to_owned(),
            "controller.sharding.namespaceSelector[0].key=operator-upgrade".to_owned(),
            "controller.sharding.namespaceSelector[0].operator=Exists".to_owned(),
        ],
    );
    assert!(
        find(&unnamed, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]
            ["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "PEER_LEASE_NAMESPACES", "value": "*"}))
    );
    assert_eq!(
        find(
            &unnamed,
            "ClusterRole",
            &format!("{CONTROLLER}-shard-peers")
        )["rules"],
        json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "watch"]}])
    );
    let split = |operator: &str, values: &[&str], extra: &[&str]| -> Vec<Value> {
        let mut sets = vec![
            "controller.sharding.enabled=true".to_owned(),
            "controller.sharding.peerReleaseNamespaces[0]=ops".to_owned(),
            "controller.sharding.ring=canary".to_owned(),
            "controller.sharding.namespaceSelector[0].key=operator-upgrade".to_owned(),
            format!("controller.sharding.namespaceSelector[0].operator={operator}"),
        ];
        for (i, v) in values.iter().enumerate() {
            sets.push(format!(
                "controller.sharding.namespaceSelector[0].values[{i}]={v}"
            ));
        }
        sets.extend(extra.iter().map(|s| (*s).to_owned()));
        template("ops", &sets)
    };
    let selector_env = |docs: &[Value]| -> Option<String> {
        find(docs, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()?
            .iter()
            .find(|e| e["name"] == "NAMESPACE_SELECTOR")
            .and_then(|e| e["value"].as_str().map(str::to_owned))
    };
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let canary_ns = labels(&[("operator-upgrade", "canary")]);
    let plain_ns = labels(&[("team", "a")]);
    for (operator, values, text, canary_selected, plain_selected) in [
        (
            "In",
            &["canary"][..],
            "operator-upgrade in (canary)",
            true,
            false,
        ),
        (
            "NotIn",
            &["canary", "beta"][..],
            "operator-upgrade notin (canary,beta)",
            false,
            true,
        ),
        ("Exists", &[][..], "operator-upgrade", true, false),
        ("DoesNotExist", &[][..], "!operator-upgrade", false, true),
    ] {
        let docs = split(operator, values, &[]);
        let rendered = selector_env(&docs).expect("NAMESPACE_SELECTOR");
        assert_eq!(rendered, text);
        // The consumer of the flag reads it back to the split it means.
        let parsed = common::namespace_selector::NamespaceSelector::parse(&rendered)
            .unwrap_or_else(|e| panic!("the controller refuses {rendered:?}: {e}"));
        assert_eq!(parsed.matches(&canary_ns), canary_selected, "{operator}");
        assert_eq!(parsed.matches(&plain_ns), plain_selected, "{operator}");

        // Both webhook configurations select the same namespaces (besides the exclusions).
        let mut expected = json!({"key": "operator-upgrade", "operator": operator});
        if !values.is_empty() {
            expected["values"] = json!(values);
        }
        for kind in [
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
        ] {
            let exprs =
                &find(&docs, kind, WEBHOOK)["webhooks"][0]["namespaceSelector"]["matchExpressions"];
            assert!(
                exprs.as_array().unwrap().contains(&expected),
                "{kind}: {exprs}"
            );
        }
    }

    let docs = split(
        "In",
        &["canary"],
        &[
            "controller.sharding.peerReleaseNamespaces[0]=appservice-system",
            "controller.sharding.peerReleaseNamespaces[1]=ops",
        ],
    );
    let peers: Vec<&Value> = docs
        .iter()
        .filter(|d| {
            d["kind"] == "Role" && d["metadata"]["name"] == format!("{CONTROLLER}-shard-peers")
        })
        .collect();
    assert_eq!(peers.len(), 1, "a Role in each peer namespace but our own");
    assert_eq!(peers[0]["metadata"]["namespace"], "appservice-system");
    assert_eq!(
        peers[0]["rules"],
        json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "watch"]}])
    );
    assert!(
        !docs.iter().any(|d| d["kind"] == "ClusterRole"
            && d["metadata"]["name"] == format!("{CONTROLLER}-shard-peers")),
        "no Lease read outside the named namespaces"
    );
    let env =
        &find(&docs, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]["env"];
    assert!(
        env.as_array()
            .unwrap()
            .contains(&json!({"name": "PEER_LEASE_NAMESPACES", "value": "appservice-system,ops"})),
        "{env}"
    );
    assert_eq!(
        find(
            &docs,
            "ClusterRole",
            &format!("{CONTROLLER}-databaseclasses")
        )["rules"][2],
        json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]})
    );

    // The webhook can keep every namespace.
    let all = split("In", &["canary"], &["webhook.followShardNamespaces=false"]);
    let exprs = &find(&all, "ValidatingWebhookConfiguration", WEBHOOK)["webhooks"][0]["namespaceSelector"]
        ["matchExpressions"];
    assert!(
        !serde_json::to_string(exprs)
            .unwrap()
            .contains("operator-upgrade"),
        "{exprs}"
    );

    // Without sharding there is no selector, no cross-namespace Lease read and no
    // namespace watch, whatever namespaceSelector says (image verification, which
    // watches namespaces too, off here).
    let off = template(
        "ops",
        &[
            "controller.imageVerification.enabled=false".to_owned(),
            "controller.sharding.namespaceSelector[0].key=operator-upgrade".to_owned(),
            "controller.sharding.namespaceSelector[0].operator=Exists".to_owned(),
        ],
    );
    assert_eq!(selector_env(&off), None);
    assert!(
        !off.iter()
            .any(|d| d["metadata"]["name"] == format!("{CONTROLLER}-shard-peers"))
    );
    assert_eq!(
        find(
            &off,
            "ClusterRole",
            &format!("{CONTROLLER}-databaseclasses")
        )["rules"][2]["verbs"],
        json!(["get"])
    );

    // A set operator without values is refused by the chart, with the reason.
    let stderr = template_refused(&[
        "controller.sharding.enabled=true",
        "controller.sharding.namespaceSelector[0].key=operator-upgrade",
        "controller.sharding.namespaceSelector[0].operator=In",
    ]);
    assert!(
        stderr.contains("operator-upgrade In needs values"),
        "{stderr}"
    );
}

#[test]
fn image_verification_is_on_by_default_and_its_values_reach_the_controller() {
    let env = |docs: &[Value], name: &str| -> Option<String> {
        find(docs, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()?
            .iter()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str().map(str::to_owned))
    };
    let default = template("ops", &[]);
    assert_eq!(env(&default, "IMAGE_VERIFICATION").as_deref(), Some("true"));
    assert_eq!(
        env(&default, "IMAGE_RESOLVE_INTERVAL").as_deref(),
        Some("1m")
    );
    assert_eq!(
        env(&default, "IMAGE_REVERIFY_INTERVAL").as_deref(),
        Some("5m")
    );
    assert_eq!(env(&default, "REGISTRY_TIMEOUT").as_deref(), Some("10s"));
    assert_eq!(env(&default, "REGISTRY_CA_FILE"), None);
    assert_eq!(env(&default, "REGISTRY_CREDENTIALS_SECRET"), None);
    assert!(
        find(&default, "Deployment", CONTROLLER)["spec"]["template"]["spec"]["volumes"].is_null(),
        "no registry CA volume unless one is named"
    );

    let set = template(
        "ops",
        &[
            "controller.imageVerification.credentialsSecret=registry-pull".to_owned(),
            "controller.imageVerification.caConfigMap=registry-ca".to_owned(),
            "controller.imageVerification.resolveInterval=5m".to_owned(),
            "controller.imageVerification.reverifyInterval=30m".to_owned(),
        ],
    );
    assert_eq!(env(&set, "IMAGE_REVERIFY_INTERVAL").as_deref(), Some("30m"));
    assert_eq!(
        env(&set, "REGISTRY_CREDENTIALS_SECRET").as_deref(),
        Some("registry-pull")
    );
    assert_eq!(env(&set, "IMAGE_RESOLVE_INTERVAL").as_deref(), Some("5m"));
    let ca = env(&set, "REGISTRY_CA_FILE").expect("REGISTRY_CA_FILE");
    let pod = &find(&set, "Deployment", CONTROLLER)["spec"]["template"]["spec"];
    assert_eq!(pod["volumes"][0]["configMap"]["name"], "registry-ca");
    let mount = pod["containers"][0]["volumeMounts"][0]["mountPath"]
        .as_str()
        .expect("mountPath");
    assert!(ca.starts_with(mount), "{ca} is under the mount {mount}");

    let off = template(
        "ops",
        &["controller.imageVerification.enabled=false".to_owned()],
    );
    assert_eq!(env(&off, "IMAGE_VERIFICATION").as_deref(), Some("false"));
    assert_eq!(env(&off, "IMAGE_RESOLVE_INTERVAL"), None);
}
