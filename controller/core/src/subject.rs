//! The AppService a pass works on, its identity checked once.
//!
//! The API server always sets a stored object's name, namespace and uid, but they are
//! `Option`s in the type. [`Subject::of`] checks them once at the start of a pass; every
//! step and builder after it takes the `Subject` and cannot fail on a missing one.

use std::ops::Deref;

use common::AppService;
use kube::runtime::reflector::ObjectRef;

use crate::error::{Error, Result};

/// An AppService with its name, namespace and uid known to be there (and not empty).
/// Dereferences to the AppService.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    app: &'a AppService,
    name: &'a str,
    namespace: &'a str,
    uid: &'a str,
}

impl<'a> Subject<'a> {
    /// `app`, once its identity is checked: a missing or empty field is a permanent error
    /// ([`Error::MissingField`]), never a panic nor an empty name further down (a
    /// database named from an empty uid would be shared).
    pub fn of(app: &'a AppService) -> Result<Self> {
        let field = |value: &'a Option<String>, name: &'static str| {
            value
                .as_deref()
                .filter(|v| !v.is_empty())
                .ok_or(Error::MissingField(name))
        };
        Ok(Subject {
            app,
            name: field(&app.metadata.name, "metadata.name")?,
            namespace: field(&app.metadata.namespace, "metadata.namespace")?,
            uid: field(&app.metadata.uid, "metadata.uid")?,
        })
    }

    pub fn app(&self) -> &'a AppService {
        self.app
    }

    pub fn name(&self) -> &'a str {
        self.name
    }

    pub fn namespace(&self) -> &'a str {
        self.namespace
    }

    pub fn uid(&self) -> &'a str {
        self.uid
    }

    /// The key of the AppService in the controller's caches and memories.
    pub fn key(&self) -> ObjectRef<AppService> {
        ObjectRef::new(self.name).within(self.namespace)
    }
}

impl Deref for Subject<'_> {
    type Target = AppService;

    fn deref(&self) -> &AppService {
        self.app
    }
}

/// The [`Subject`] of a test's AppService, which has its identity.
#[cfg(test)]
pub(crate) fn subject(app: &AppService) -> Subject<'_> {
    Subject::of(app).expect("a test AppService has a name, namespace and uid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_missing_or_empty_field_is_named() {
        let mut app = AppService::new("shop", common::AppServiceSpec::default());
        app.metadata.namespace = Some("team".into());
        app.metadata.uid = Some("0f3c2a1b-9d8e-4f7a-b6c5-d4e3f2a1b0c9".into());
        let s = Subject::of(&app).expect("complete");
        assert_eq!(
            (s.name(), s.namespace(), s.uid()),
            ("shop", "team", "0f3c2a1b-9d8e-4f7a-b6c5-d4e3f2a1b0c9")
        );
        assert_eq!(s.key(), ObjectRef::new("shop").within("team"));
        for (field, clear) in [
            (
                "metadata.name",
                (|a: &mut AppService| a.metadata.name = None) as fn(&mut _),
            ),
            ("metadata.name", |a| a.metadata.name = Some(String::new())),
            ("metadata.namespace", |a| a.metadata.namespace = None),
            ("metadata.namespace", |a| {
                a.metadata.namespace = Some(String::new())
            }),
            ("metadata.uid", |a| a.metadata.uid = None),
            ("metadata.uid", |a| a.metadata.uid = Some(String::new())),
        ] {
            let mut broken = app.clone();
            clear(&mut broken);
            assert!(
                matches!(Subject::of(&broken), Err(Error::MissingField(f)) if f == field),
                "{field}"
            );
        }
    }
}
