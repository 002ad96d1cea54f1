//! Defaulting: the one place that decides what an omitted field means.
//!
//! The webhook turns the difference into a JSON patch; the controller applies the same
//! function before building children, so both agree even when the webhook is bypassed.
//! Every function here is idempotent: defaulting a defaulted object changes nothing.

use crate::names::LABEL_NAME;
use crate::types::{AppService, AppServiceSpec, DEFAULT_PORT, DEFAULT_REPLICAS};

/// Fills every omitted field of a spec with its default.
pub fn default_spec(spec: &mut AppServiceSpec) {
    spec.replicas.get_or_insert(DEFAULT_REPLICAS);
    spec.port.get_or_insert(DEFAULT_PORT);
}

/// Defaults an AppService: its spec, plus the recommended `app.kubernetes.io/name` label
/// when the object has a name and the user did not set that label. User labels are
/// never changed.
pub fn default_object(app: &mut AppService) {
    default_spec(&mut app.spec);
    if let Some(name) = app.metadata.name.clone().filter(|n| !n.is_empty()) {
        app.metadata
            .labels
            .get_or_insert_with(Default::default)
            .entry(LABEL_NAME.to_owned())
            .or_insert(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DatabaseSpec;
    use std::collections::BTreeMap;

    #[test]
    fn fills_replicas_and_port() {
        let mut spec = AppServiceSpec {
            image: "nginx:1.27".into(),
            ..Default::default()
        };
        default_spec(&mut spec);
        assert_eq!(spec.replicas, Some(DEFAULT_REPLICAS));
        assert_eq!(spec.port, Some(DEFAULT_PORT));
    }

    #[test]
    fn keeps_explicit_values_including_zero_replicas() {
        let mut spec = AppServiceSpec {
            image: "nginx:1.27".into(),
            replicas: Some(0),
            port: Some(9090),
            database: Some(DatabaseSpec {
                enabled: false,
                class: None,
            }),
            ..Default::default()
        };
        let before = spec.clone();
        default_spec(&mut spec);
        assert_eq!(spec, before);
    }

    #[test]
    fn adds_name_label_without_touching_user_labels() {
        let mut app = AppService::new("checkout", AppServiceSpec::default());
        app.metadata.labels = Some(BTreeMap::from([("team".into(), "payments".into())]));
        default_object(&mut app);
        let labels = app.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels["team"], "payments");
        assert_eq!(labels[LABEL_NAME], "checkout");

        let mut custom = AppService::new("checkout", AppServiceSpec::default());
        custom.metadata.labels = Some(BTreeMap::from([(LABEL_NAME.into(), "shop".into())]));
        default_object(&mut custom);
        assert_eq!(
            custom.metadata.labels.unwrap_or_default()[LABEL_NAME],
            "shop"
        );
    }

    #[test]
    fn no_label_without_a_name() {
        // generateName: the name is not known yet when the mutating webhook runs.
        let mut app = AppService::new("", AppServiceSpec::default());
        app.metadata.name = None;
        default_object(&mut app);
        assert_eq!(app.metadata.labels, None);
    }
}
