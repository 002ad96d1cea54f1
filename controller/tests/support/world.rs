//! The world most suites test: a [`Fixture`] and the in-process controller running on it,
//! with what every such suite asks of it (create an AppService, assert it stays quiet).

use common::{AppService, AppServiceSpec};

use super::{Fixture, Running, Setup};

/// A [`Fixture`] and its controller, at the shipped defaults unless the [`Setup`] says
/// otherwise.
pub struct World {
    pub fixture: Fixture,
    pub ctl: Running,
}

impl std::ops::Deref for World {
    type Target = Fixture;
    fn deref(&self) -> &Fixture {
        &self.fixture
    }
}

impl World {
    /// The fixture `setup` describes, with its controller started.
    pub async fn start(setup: Setup<'_>) -> anyhow::Result<World> {
        let (fixture, ctl) = setup.start().await?;
        Ok(World { fixture, ctl })
    }

    pub async fn create(&self, name: &str, spec: AppServiceSpec) -> anyhow::Result<AppService> {
        super::create(&self.apps, &AppService::new(name, spec)).await
    }

    /// Asserts the controller writes nothing while it reconciles each AppService at least
    /// `n` more times, once the world has settled ([`super::settle`]: one reconcile of
    /// each wrote nothing, so a controller that writes on every reconcile fails too).
    pub async fn quiet(&self, n: u64) -> anyhow::Result<()> {
        self.quiet_with(n, async |_| Ok(())).await
    }

    /// [`Self::quiet`], with `more` pokes of the AppServices (by name) of the test's own
    /// between the reconciles and the count: their events must not cause writes either.
    pub async fn quiet_with(
        &self,
        n: u64,
        more: impl AsyncFnOnce(&[String]) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let metrics = &self.ctl.metrics;
        let names = super::settle(self, metrics).await?;
        let writes = super::writes_by_resource(metrics);
        super::poke(self, metrics, &names, n).await?;
        more(&names).await?;
        assert_eq!(
            super::writes_by_resource(metrics),
            writes,
            "writes at steady state over {n} reconciles"
        );
        Ok(())
    }
}
