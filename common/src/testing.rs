//! The one way tests write an AppService (feature `test-util`, and this crate's own
//! tests): [`app`] starts from a name and an image, as a client writes it; the builder
//! adds what a test varies, and [`AppBuilder::stored`] what the API server adds
//! (namespace, uid, generation), for the pure builders and status that need an identity.

use crate::types::{AppPort, AppService, AppServiceSpec, DatabaseSpec, EnvVar};

/// The namespace of [`AppBuilder::stored`].
pub const NAMESPACE: &str = "shop";

/// The uid of [`AppBuilder::stored`] (the API server's form: a UUID).
pub const UID: &str = "0f3c2a1b-9d8e-4f7a-b6c5-d4e3f2a1b0c9";

/// A spec running `image`, nothing else set.
pub fn spec(image: &str) -> AppServiceSpec {
    AppServiceSpec {
        image: image.to_owned(),
        ..AppServiceSpec::default()
    }
}

/// An AppService named `name` with `spec`, as a client writes it (no namespace, no uid).
pub fn written(name: &str, spec: AppServiceSpec) -> AppService {
    AppService::new(name, spec)
}

/// An AppService named `name` with `spec`, as the API server stores it: see
/// [`AppBuilder::stored`].
pub fn stored(name: &str, spec: AppServiceSpec) -> AppService {
    app(name, "").spec(|s| *s = spec).stored().build()
}

/// An AppService named `name` running `image`, with nothing else set: no namespace, no
/// uid, no defaults, as a client sends it.
pub fn app(name: &str, image: &str) -> AppBuilder {
    AppBuilder {
        app: AppService::new(
            name,
            AppServiceSpec {
                image: image.to_owned(),
                ..AppServiceSpec::default()
            },
        ),
    }
}

/// What [`app`] started, with what a test varies.
#[derive(Clone, Debug)]
#[must_use]
pub struct AppBuilder {
    app: AppService,
}

impl AppBuilder {
    /// `spec.replicas`.
    pub fn replicas(mut self, replicas: i32) -> Self {
        self.app.spec.replicas = Some(replicas);
        self
    }

    /// One more entry of `spec.ports`: an HTTP port named as the defaults name it.
    pub fn port(mut self, port: i32) -> Self {
        self.app.spec.ports.push(AppPort::http(port));
        self
    }

    /// One more entry of `spec.env` with a literal value.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.app.spec.env.push(EnvVar {
            name: name.to_owned(),
            value: Some(value.to_owned()),
            value_from: None,
        });
        self
    }

    /// `spec.database` of the DatabaseClass `class`.
    pub fn database(mut self, class: &str) -> Self {
        self.app.spec.database = Some(DatabaseSpec {
            class: class.to_owned(),
        });
        self
    }

    /// Any other change of the spec.
    pub fn spec(mut self, edit: impl FnOnce(&mut AppServiceSpec)) -> Self {
        edit(&mut self.app.spec);
        self
    }

    /// As the API server stores it: namespace [`NAMESPACE`], uid [`UID`], generation 1.
    pub fn stored(self) -> Self {
        self.namespace(NAMESPACE).uid(UID).generation(1)
    }

    /// `metadata.namespace`.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.app.metadata.namespace = Some(namespace.to_owned());
        self
    }

    /// `metadata.uid`.
    pub fn uid(mut self, uid: &str) -> Self {
        self.app.metadata.uid = Some(uid.to_owned());
        self
    }

    /// `metadata.generation`.
    pub fn generation(mut self, generation: i64) -> Self {
        self.app.metadata.generation = Some(generation);
        self
    }

    /// The AppService.
    pub fn build(self) -> AppService {
        self.app
    }
}

impl From<AppBuilder> for AppService {
    fn from(builder: AppBuilder) -> Self {
        builder.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_object_has_no_identity_and_a_stored_one_has_all_of_it() {
        let written = app("web", "nginx:1.27").replicas(2).port(8080).build();
        assert_eq!(written.metadata.name.as_deref(), Some("web"));
        assert_eq!(written.spec.image, "nginx:1.27");
        assert_eq!(written.spec.replicas, Some(2));
        assert_eq!(written.spec.ports, vec![AppPort::http(8080)]);
        assert_eq!(written.metadata.namespace, None);
        assert_eq!(written.metadata.uid, None);

        let stored = app("web", "nginx:1.27").stored().build();
        assert_eq!(stored.metadata.namespace.as_deref(), Some(NAMESPACE));
        assert_eq!(stored.metadata.uid.as_deref(), Some(UID));
        assert_eq!(stored.metadata.generation, Some(1));
    }
}
