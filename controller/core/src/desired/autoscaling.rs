//! The HorizontalPodAutoscaler of an AppService with `spec.autoscaling`: it scales the
//! AppService itself, through its scale subresource, so every write of `replicas` passes
//! the webhook's rules and the Deployment follows the AppService as it always does.

use common::names::{GROUP, autoscaler_name};
use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec, MetricSpec,
    MetricTarget, ResourceMetricSource,
};
use kube::Resource;

use super::child_metadata;
use crate::subject::Subject;

/// The autoscaler `<name>` while `spec.autoscaling` asks for one: between its least and
/// most replicas, on the average CPU use of the Pods as a percentage of their request.
pub fn desired_autoscaler(app: &Subject) -> Option<HorizontalPodAutoscaler> {
    let autoscaling = app.spec.autoscaling.as_ref()?;
    let name = app.name();
    Some(HorizontalPodAutoscaler {
        metadata: child_metadata(app, autoscaler_name(name)),
        spec: HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some(format!("{GROUP}/{}", common::crd::STORAGE_VERSION)),
                kind: common::AppService::kind(&()).into_owned(),
                name: name.to_owned(),
            },
            min_replicas: Some(autoscaling.min_replicas()),
            max_replicas: autoscaling.max_replicas,
            metrics: Some(vec![MetricSpec {
                type_: "Resource".to_owned(),
                resource: Some(ResourceMetricSource {
                    name: "cpu".to_owned(),
                    target: MetricTarget {
                        type_: "Utilization".to_owned(),
                        average_utilization: Some(autoscaling.target_cpu_utilization()),
                        ..MetricTarget::default()
                    },
                }),
                ..MetricSpec::default()
            }]),
            behavior: None,
        },
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subject::subject;
    use common::testing::stored;
    use common::{AppServiceSpec, AutoscalingSpec};

    #[test]
    fn it_scales_the_appservice_on_cpu_between_its_bounds() {
        let mut spec = AppServiceSpec {
            image: "registry.example.com/web:1".into(),
            ..AppServiceSpec::default()
        };
        assert!(desired_autoscaler(&subject(&stored("web", spec.clone()))).is_none());
        spec.autoscaling = Some(AutoscalingSpec {
            min_replicas: None,
            max_replicas: 6,
            target_cpu_utilization_percentage: Some(50),
        });
        let hpa = desired_autoscaler(&subject(&stored("web", spec))).unwrap();
        let spec = hpa.spec;
        assert_eq!(spec.scale_target_ref.kind, "AppService");
        assert_eq!(
            spec.scale_target_ref.api_version.as_deref(),
            Some("platform.example.com/v1beta1")
        );
        assert_eq!((spec.min_replicas, spec.max_replicas), (Some(1), 6));
        let target = &spec.metrics.unwrap()[0].resource.clone().unwrap();
        assert_eq!(target.name, "cpu");
        assert_eq!(target.target.average_utilization, Some(50));
        assert!(hpa.metadata.owner_references.unwrap()[0].controller == Some(true));
    }
}
