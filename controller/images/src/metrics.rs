//! `appservice_controller_registry_*` and `appservice_controller_image_*`: image
//! verification's registry calls, verdicts and caches.

use std::time::Duration;

use controller_core::metrics::Families;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

telemetry::label_values! {
    /// A registry operation of image verification.
    pub enum RegistryOperation {
        Resolve => "resolve",
        SignatureManifest => "signature_manifest",
        SignatureBlob => "signature_blob",
    }

    /// How a registry operation ended.
    pub enum RegistryOutcome {
        Ok => "ok",
        NotFound => "not_found",
        Denied => "denied",
        Unavailable => "unavailable",
        Invalid => "invalid",
        TooLarge => "too_large",
    }

    /// A verdict on one image under its policies (`image_verifications`).
    pub enum Verification {
        Verified => "verified",
        Unsigned => "unsigned",
        Invalid => "invalid",
        NotFound => "not_found",
        Denied => "denied",
        Unavailable => "unavailable",
        TooLarge => "too_large",
        InvalidAnswer => "invalid_answer",
        Revoked => "revoked",
        PolicyNotUsable => "policy_not_usable",
    }

    /// A cache of image verification.
    pub enum ImageCache { Tags => "tags", Signatures => "signatures" }

    /// A cache lookup's result.
    pub enum Lookup { Hit => "hit", Miss => "miss" }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RegistryLabel {
    pub operation: RegistryOperation,
    pub result: RegistryOutcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RegistryOperationLabel {
    pub operation: RegistryOperation,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerificationLabel {
    pub result: Verification,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabel {
    pub cache: ImageCache,
    pub result: Lookup,
}

/// Metrics of image verification: registry calls, verdicts, caches. A clone records
/// into the same series.
#[derive(Clone)]
pub struct ImageMetrics {
    requests: Family<RegistryLabel, Counter>,
    latency: Family<RegistryOperationLabel, Histogram>,
    verifications: Family<VerificationLabel, Counter>,
    lookups: Family<CacheLabel, Counter>,
    signature_entries: Gauge,
}

impl Default for ImageMetrics {
    fn default() -> Self {
        let m = ImageMetrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            }),
            verifications: Family::default(),
            lookups: Family::default(),
            signature_entries: Gauge::default(),
        };
        for &operation in RegistryOperation::ALL {
            for &result in RegistryOutcome::ALL {
                let _ = m
                    .requests
                    .get_or_create(&RegistryLabel { operation, result });
            }
            let _ = m
                .latency
                .get_or_create(&RegistryOperationLabel { operation });
        }
        for &result in Verification::ALL {
            let _ = m.verifications.get_or_create(&VerificationLabel { result });
        }
        for &cache in ImageCache::ALL {
            for &result in Lookup::ALL {
                let _ = m.lookups.get_or_create(&CacheLabel { cache, result });
            }
        }
        m
    }
}

impl Families for ImageMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "registry_requests",
            "Requests of image verification to registries, by operation and result",
            self.requests.clone(),
        );
        registry.register(
            "registry_request_duration_seconds",
            "Duration of one registry operation of image verification, timeouts included",
            self.latency.clone(),
        );
        registry.register(
            "image_verifications",
            "Verdicts on an AppService's image under its ImagePolicies, by result",
            self.verifications.clone(),
        );
        registry.register(
            "image_cache_lookups",
            "Lookups in the tag and signature caches of image verification, by result",
            self.lookups.clone(),
        );
        registry.register(
            "image_signature_cache_entries",
            "Digests whose signatures are cached",
            self.signature_entries.clone(),
        );
    }
}

impl ImageMetrics {
    pub fn registry_request(
        &self,
        operation: RegistryOperation,
        result: RegistryOutcome,
        took: Duration,
    ) {
        self.requests
            .get_or_create(&RegistryLabel { operation, result })
            .inc();
        self.latency
            .get_or_create(&RegistryOperationLabel { operation })
            .observe(took.as_secs_f64());
    }

    pub fn verification(&self, result: Verification) {
        self.verifications
            .get_or_create(&VerificationLabel { result })
            .inc();
    }

    pub fn lookup(&self, cache: ImageCache, hit: bool) {
        let result = if hit { Lookup::Hit } else { Lookup::Miss };
        self.lookups
            .get_or_create(&CacheLabel { cache, result })
            .inc();
    }

    pub fn set_signature_entries(&self, n: usize) {
        self.signature_entries.set(n as i64);
    }

    /// Requests made of `operation` with `result` (for tests and benchmarks).
    pub fn requests_of(&self, operation: RegistryOperation, result: RegistryOutcome) -> u64 {
        self.requests
            .get_or_create(&RegistryLabel { operation, result })
            .get()
    }

    pub fn verifications_of(&self, result: Verification) -> u64 {
        self.verifications
            .get_or_create(&VerificationLabel { result })
            .get()
    }
}
