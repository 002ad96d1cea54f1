//! The harness's PostgreSQL: a real server from the machine's installation, over TLS,
//! that can be stopped and started again on the same data and port.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use harness::Postgres;

#[tokio::test]
async fn postgres_serves_tls_logins_and_survives_a_restart()
-> Result<(), Box<dyn std::error::Error>> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let mut pg = Postgres::start().await?;
    let admin = pg.connect_admin().await?;
    let row = admin
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?;
    assert!(row.get::<_, bool>(0), "the harness connects over TLS");
    admin
        .batch_execute("CREATE ROLE probe LOGIN PASSWORD 'probe-pw'")
        .await?;
    admin
        .batch_execute("CREATE DATABASE probe OWNER probe")
        .await?;
    let wrong = pg
        .connect(harness::postgres::SUPERUSER, "not-the-password", "postgres")
        .await;
    assert!(wrong.is_err(), "password authentication is enforced");

    pg.stop();
    assert!(!pg.is_running());
    assert!(
        pg.connect_admin().await.is_err(),
        "a stopped server refuses logins"
    );

    pg.start_again().await?;
    // Same data: what was created before the outage is still there.
    let probe = pg.connect("probe", "probe-pw", "probe").await?;
    probe.batch_execute("CREATE TABLE t (id int)").await?;
    Ok(())
}

#[test]
fn a_missing_installation_says_how_to_install_it() {
    let empty = tempfile::tempdir().unwrap();
    let message = harness::postgres::find_pg_bin(None, empty.path())
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("apt-get install -y postgresql"),
        "{message}"
    );
    let message = harness::postgres::find_pg_bin(Some(empty.path().to_owned()), empty.path())
        .unwrap_err()
        .to_string();
    assert!(message.contains("APPSERVICE_PG_BIN"), "{message}");
}

#[test]
fn the_newest_installed_version_is_chosen() {
    let root = tempfile::tempdir().unwrap();
    for version in ["13", "16", "9"] {
        let bin = root.path().join(version).join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("postgres"), "").unwrap();
        std::fs::write(bin.join("initdb"), "").unwrap();
    }
    assert_eq!(
        harness::postgres::find_pg_bin(None, root.path()).unwrap(),
        root.path().join("16").join("bin")
    );
}
