//! The orphan scan: databases and roles whose AppService no longer exists.
//!
//! The finalizer drops an AppService's database before the object goes, so an orphan
//! means someone removed the finalizer by hand, deleted the namespace's objects from etcd,
//! or restored a cluster from a backup older than the database. Every `interval`, while
//! this replica leads, each DatabaseClass's server is asked for the roles and databases
//! named like ours (`appsvc_<uid>`); those whose UID belongs to no AppService of the
//! cluster are
//!
//! * `retained` when their role cannot log in: deletionPolicy Retain kept them on
//!   purpose. Counted, never touched.
//! * `orphaned` otherwise: counted (`appservice_controller_database_orphans`), reported by
//!   a Warning Event on the class when the set changes, and, for a class with
//!   `orphanPolicy: Drop`, dropped once two scans in a row found them (an AppService
//!   created between the server's answer and the list would otherwise be at risk, and an
//!   admin gets one interval to react to the Event).
//!
//! The server is asked first and the AppServices listed second: a database created for a
//! new AppService is always older than the AppService, so the list names it. The list is
//! of the whole cluster (metadata only, paged), never a cache that could be partial.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use common::{AppService, DatabaseClass, OrphanPolicy};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType};
use tokio::sync::watch;
use tracing::{info, warn};

use super::error::DbResult;
use super::{DatabaseError, Databases, sql};

/// The most roles and databases one scan of a class reads; a server with more reports
/// the first ones and says so.
pub const MAX_OBJECTS: i64 = 10_000;
/// AppServices listed per page.
const PAGE: u32 = 500;
/// Names listed in one Event (the count is always complete).
const NAMES_IN_EVENT: usize = 10;

/// One role and/or database named like ours, as the server reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub name: String,
    /// Whether the role may log in; `None`: no such role (a database without its role).
    pub login: Option<bool>,
    pub database: bool,
}

/// What one scan of a class found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// Names whose AppService is gone and whose role can still log in (or has no role).
    pub orphaned: BTreeSet<String>,
    /// Names whose AppService is gone, kept without a login by deletionPolicy Retain.
    pub retained: BTreeSet<String>,
    /// The server has more objects named like ours than one scan reads.
    pub truncated: bool,
}

/// Sorts what the server reported into orphaned and retained, given the UIDs (hex,
/// without dashes) of every AppService that exists. Names not of our shape are ignored.
pub fn classify(found: &[Found], live: &HashSet<String>, truncated: bool) -> Scan {
    let mut scan = Scan {
        truncated,
        ..Scan::default()
    };
    for f in found {
        let Some(uid) = sql::uid_hex_of(&f.name) else {
            continue;
        };
        if live.contains(uid) {
            continue;
        }
        if f.login == Some(false) {
            scan.retained.insert(f.name.clone());
        } else {
            scan.orphaned.insert(f.name.clone());
        }
    }
    scan
}

/// The UID of an AppService as database names carry it.
fn uid_hex(app: &kube::core::PartialObjectMeta<AppService>) -> Option<String> {
    let uid = app.metadata.uid.as_deref()?;
    let name = sql::db_name(uid);
    sql::uid_hex_of(&name).map(str::to_owned)
}

/// The scan's memory between runs: per class, the orphans of the last scan (to report a
/// change once, and to drop only what two scans in a row found).
#[derive(Default)]
pub struct Memory {
    last: Mutex<BTreeMap<String, BTreeSet<String>>>,
}

impl Databases {
    /// Scans every DatabaseClass every `interval` while `leading` says this replica
    /// leads. Runs until the process ends.
    pub async fn scan_orphans_every(&self, interval: Duration, mut leading: watch::Receiver<bool>) {
        loop {
            // Wait to lead, then one interval: a new leader does not scan at once, so a
            // restarting controller does not hit every server at start.
            while !*leading.borrow_and_update() {
                if leading.changed().await.is_err() {
                    return;
                }
            }
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                changed = leading.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    continue;
                }
            }
            if *leading.borrow() {
                self.scan_orphans().await;
            }
        }
    }

    /// One scan of every class. Failures are logged and counted, never fatal.
    pub async fn scan_orphans(&self) {
        let memory = &self.orphans;
        let classes: Api<DatabaseClass> = Api::all(self.client.clone());
        let classes = match classes.list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(e) => {
                warn!(error = %e, "orphan scan: listing DatabaseClasses failed");
                self.series.orphan_scan(false);
                return;
            }
        };
        {
            // Series and memory of classes that are gone.
            let names: BTreeSet<String> = classes.iter().map(ResourceExt::name_any).collect();
            let mut last = super::lock(&memory.last);
            last.retain(|class, _| {
                let keep = names.contains(class);
                if !keep {
                    self.series.forget_class(class);
                }
                keep
            });
        }
        for class in &classes {
            let name = class.name_any();
            match self.scan_class(class, memory).await {
                Ok(()) => self.series.orphan_scan(true),
                Err(e) => {
                    warn!(class = %name, error = %e, "orphan scan of a DatabaseClass failed");
                    self.series.orphan_scan(false);
                }
            }
        }
    }

    /// Scans one class: reports its orphans, and drops those two scans found under
    /// `orphanPolicy: Drop`.
    async fn scan_class(&self, class: &DatabaseClass, memory: &Memory) -> DbResult<()> {
        let class_name = class.name_any();
        let server = self.server(&class_name).await?;
        let (conn, _) = self.connect(&server).await?;
        let session = self.session(&server, &conn);
        let rows = session
            .query(
                "listing roles and databases",
                sql::OWN_OBJECTS,
                &(MAX_OBJECTS + 1),
            )
            .await?;
        let truncated = rows.len() > usize::try_from(MAX_OBJECTS).unwrap_or(usize::MAX);
        let found: Vec<Found> = rows
            .iter()
            .take(usize::try_from(MAX_OBJECTS).unwrap_or(usize::MAX))
            .filter_map(|row| {
                Some(Found {
                    name: row.try_get(0).ok()?,
                    login: row.try_get(1).ok()?,
                    database: row.try_get(2).ok()?,
                })
            })
            .collect();
        // After the server's answer: every database it named has its AppService in this
        // list, unless that AppService is gone.
        let live = self.live_uids().await?;
        let scan = classify(&found, &live, truncated);
        if scan.truncated {
            warn!(class = %class_name, max = MAX_OBJECTS, "orphan scan read only the first objects named like ours");
        }

        let previous = super::lock(&memory.last)
            .get(&class_name)
            .cloned()
            .unwrap_or_default();
        let mut left = scan.orphaned.clone();
        if class.spec.orphan_policy == OrphanPolicy::Drop {
            for name in scan.orphaned.intersection(&previous) {
                let has_database = found.iter().any(|f| &f.name == name && f.database);
                match self.drop_orphan(&session, name, has_database).await {
                    Ok(()) => {
                        left.remove(name);
                        self.series.orphan_dropped(&class_name);
                        info!(class = %class_name, database = %name, "orphaned database and role dropped");
                        self.publish_on_class(
                            class,
                            EventType::Normal,
                            "OrphanDropped",
                            format!(
                                "dropped database and role {name} on {}: no AppService has UID {} (found orphaned in two scans; orphanPolicy Drop)",
                                server.address(),
                                sql::uid_hex_of(name).unwrap_or_default()
                            ),
                        )
                        .await;
                    }
                    Err(e) => {
                        warn!(class = %class_name, database = %name, error = %e, "dropping an orphaned database failed");
                    }
                }
            }
        }
        // What is left after the drops.
        self.series
            .set_orphans(&class_name, left.len(), scan.retained.len());
        if left != previous && !left.is_empty() {
            let names: Vec<&str> = left
                .iter()
                .take(NAMES_IN_EVENT)
                .map(String::as_str)
                .collect();
            let more = left.len().saturating_sub(names.len());
            let action = match class.spec.orphan_policy {
                OrphanPolicy::Report => {
                    "left untouched (orphanPolicy Report); see the runbook AppServiceOrphanedDatabases"
                }
                OrphanPolicy::Drop => {
                    "each is dropped when the next scan finds it orphaned again (orphanPolicy Drop)"
                }
            };
            self.publish_on_class(
                class,
                EventType::Warning,
                "OrphanedDatabases",
                format!(
                    "{} database(s) and role(s) on {} belong to no AppService: {}{}; {action}",
                    left.len(),
                    server.address(),
                    names.join(", "),
                    if more > 0 {
                        format!(" and {more} more")
                    } else {
                        String::new()
                    },
                ),
            )
            .await;
        }
        super::lock(&memory.last).insert(class_name, left);
        Ok(())
    }

    /// The UIDs of every AppService of the cluster, read from the API server.
    async fn live_uids(&self) -> DbResult<HashSet<String>> {
        let api: Api<AppService> = Api::all(self.client.clone());
        let mut uids = HashSet::new();
        let mut params = ListParams::default().limit(PAGE);
        loop {
            let page = api.list_metadata(&params).await?;
            uids.extend(page.items.iter().filter_map(uid_hex));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(uids),
            }
        }
    }

    /// Drops one orphan: its sessions, its database, its role.
    async fn drop_orphan(
        &self,
        session: &super::server::Session<'_>,
        name: &str,
        has_database: bool,
    ) -> DbResult<()> {
        if sql::uid_hex_of(name).is_none() {
            return Err(DatabaseError::Internal(format!(
                "{name:?} is not a name the controller gives"
            )));
        }
        if has_database {
            session
                .execute("DROP DATABASE", &sql::drop_database(name))
                .await?;
        }
        session.execute("DROP ROLE", &sql::drop_role(name)).await
    }

    async fn publish_on_class(
        &self,
        class: &DatabaseClass,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: "ScanOrphans".to_owned(),
            secondary: None,
        };
        controller_core::report::publish(&self.recorder, &self.metrics, class, &event).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(uid: &str, login: Option<bool>, database: bool) -> Found {
        Found {
            name: sql::db_name(uid),
            login,
            database,
        }
    }

    #[test]
    fn only_names_of_gone_appservices_are_orphans_and_retained_ones_are_apart() {
        let live_uid = "0f3c2a1b-9d8e-4f7a-b6c5-d4e3f2a1b0c9";
        let gone = "11111111-2222-3333-4444-555555555555";
        let kept = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
        let lost_role = "99999999-8888-7777-6666-555555555555";
        let live: HashSet<String> = [sql::uid_hex_of(&sql::db_name(live_uid)).unwrap().to_owned()]
            .into_iter()
            .collect();
        let scan = classify(
            &[
                found(live_uid, Some(true), true),
                found(gone, Some(true), true),
                found(kept, Some(false), true),
                found(lost_role, None, true),
                Found {
                    name: "appsvc_not_ours".into(),
                    login: Some(true),
                    database: true,
                },
            ],
            &live,
            false,
        );
        assert_eq!(
            scan.orphaned,
            [sql::db_name(gone), sql::db_name(lost_role)]
                .into_iter()
                .collect()
        );
        assert_eq!(scan.retained, [sql::db_name(kept)].into_iter().collect());
        assert!(!scan.truncated);
        // Nothing of a live AppService, whatever its role's state.
        let all_live: HashSet<String> = [gone, kept, lost_role, live_uid]
            .iter()
            .map(|u| sql::uid_hex_of(&sql::db_name(u)).unwrap().to_owned())
            .collect();
        let none = classify(
            &[
                found(gone, Some(true), true),
                found(kept, Some(false), false),
            ],
            &all_live,
            true,
        );
        assert!(none.orphaned.is_empty() && none.retained.is_empty());
        assert!(none.truncated);
    }
}
