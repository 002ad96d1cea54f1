//! A real PostgreSQL server for tests, started from the machine's installation
//! (`/usr/lib/postgresql/<version>/bin`, Debian's `postgresql` package).
//!
//! Each [`Postgres`] has its own data directory, a free port on 127.0.0.1, TLS with a
//! certificate from the project's `certs` crate, and a superuser with a random password.
//! It runs under the harness's no-orphans wrapper ([`crate::process`]), as an unprivileged
//! user when the tests run as root (PostgreSQL refuses to run as root). [`Postgres::stop`]
//! and [`Postgres::start_again`] simulate an outage on the same data and port.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::distr::{Alphanumeric, SampleString};
use tokio_postgres::config::SslMode;

use crate::error::{Error, Result, io};
use crate::process::{Component, Spec, free_port, lost_the_port, tail};

/// Environment variable naming a directory with `initdb`, `postgres` and `pg_ctl`.
pub const PG_BIN_ENV: &str = "APPSERVICE_PG_BIN";
/// The superuser the harness creates.
pub const SUPERUSER: &str = "appservice_admin";
const INSTALL_HINT: &str = "install PostgreSQL with `apt-get update && apt-get install -y postgresql` \
     (Debian/Ubuntu; `cargo xtask test` and .ci/run do this when it is missing), or point \
     APPSERVICE_PG_BIN at a directory holding initdb, postgres and pg_ctl";
const START_TIMEOUT: Duration = Duration::from_secs(60);
const DIR_PREFIX: &str = "appservice-postgres-";

/// A running (or stopped) PostgreSQL server.
pub struct Postgres {
    bin: PathBuf,
    root: PathBuf,
    data: PathBuf,
    log_dir: PathBuf,
    port: u16,
    password: String,
    ca_pem: String,
    run_as: Option<(u32, u32)>,
    component: Option<Component>,
    starts: u32,
    /// The address besides 127.0.0.1 it listens on, and the clients' range it admits
    /// there ([`Postgres::start_also_on`]).
    also: Option<(String, String)>,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres")
            .field("bin", &self.bin)
            .field("data", &self.data)
            .field("port", &self.port)
            .field("password", &"[elided]")
            .finish()
    }
}

/// The directory of the newest installed PostgreSQL's binaries: `$APPSERVICE_PG_BIN`,
/// else the newest `/usr/lib/postgresql/<version>/bin`.
pub fn pg_bin_dir() -> Result<PathBuf> {
    find_pg_bin(
        std::env::var_os(PG_BIN_ENV).map(PathBuf::from),
        Path::new("/usr/lib/postgresql"),
    )
}

/// [`pg_bin_dir`] with its inputs as parameters: `explicit` (the variable) wins, else
/// the newest `<root>/<version>/bin` holding `postgres` and `initdb`.
pub fn find_pg_bin(explicit: Option<PathBuf>, root: &Path) -> Result<PathBuf> {
    if let Some(dir) = explicit {
        return if dir.join("postgres").is_file() {
            Ok(dir)
        } else {
            Err(Error::Assets(format!(
                "{PG_BIN_ENV}={} has no `postgres` binary; {INSTALL_HINT}",
                dir.display()
            )))
        };
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let version = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                    let bin = e.path().join("bin");
                    (bin.join("postgres").is_file() && bin.join("initdb").is_file())
                        .then_some((version, bin))
                })
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        Error::Assets(format!(
            "no PostgreSQL server found under {}; {INSTALL_HINT}",
            root.display()
        ))
    })
}

/// The uid and gid to run PostgreSQL as when we are root: the `postgres` user the
/// package creates, else `nobody`.
fn unprivileged_user() -> Result<Option<(u32, u32)>> {
    let id = |args: &[&str]| -> Option<u32> {
        let out = Command::new("id").args(args).output().ok()?;
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    if id(&["-u"]) != Some(0) {
        return Ok(None);
    }
    for user in ["postgres", "nobody"] {
        if let (Some(uid), Some(gid)) = (id(&["-u", user]), id(&["-g", user])) {
            return Ok(Some((uid, gid)));
        }
    }
    Err(Error::Assets(
        "running as root, and neither a `postgres` nor a `nobody` user exists to run PostgreSQL as"
            .to_owned(),
    ))
}

fn chown_tree(path: &Path, uid: u32, gid: u32) -> Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .map_err(io(format!("chown {}", path.display())))?;
    if path.is_dir() {
        for entry in std::fs::read_dir(path).map_err(io(format!("reading {}", path.display())))? {
            let entry = entry.map_err(io(format!("reading {}", path.display())))?;
            chown_tree(&entry.path(), uid, gid)?;
        }
    }
    Ok(())
}

impl Postgres {
    /// Initialises a data directory and starts the server; returns once it accepts a
    /// TLS login of the superuser.
    pub async fn start() -> Result<Postgres> {
        Self::start_with(None).await
    }

    /// [`Postgres::start`], also listening on `address` (a local address, such as the
    /// real node's bridge that its Pods reach) for clients from `clients` (a CIDR),
    /// password logins over TLS or not, the certificate valid for `address` too.
    pub async fn start_also_on(address: &str, clients: &str) -> Result<Postgres> {
        Self::start_with(Some((address.to_owned(), clients.to_owned()))).await
    }

    async fn start_with(also: Option<(String, String)>) -> Result<Postgres> {
        let bin = pg_bin_dir()?;
        let run_as = unprivileged_user()?;
        crate::process::prune_old_dirs(DIR_PREFIX);
        let root = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(io("creating PostgreSQL's temporary directory"))?
            .keep();
        let data = root.join("data");
        let log_dir = root.join("logs");
        let socket_dir = root.join("socket");
        for dir in [&log_dir, &socket_dir] {
            std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        }
        let password = Alphanumeric.sample_string(&mut rand::rng(), 32);
        let pwfile = root.join("pwfile");
        std::fs::write(&pwfile, &password).map_err(io("writing the password file"))?;

        let ca = certs::Ca::new("appservice-tests PostgreSQL CA")?;
        let serving = ca.serving_cert(&names(also.as_ref()))?;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755))
            .map_err(io(format!("chmod {}", root.display())))?;
        if let Some((uid, gid)) = run_as {
            chown_tree(&root, uid, gid)?;
        }

        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", SUPERUSER, "-E", "UTF8", "--locale=C", "--no-sync"])
            .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
            .arg(format!("--pwfile={}", pwfile.display()));
        let out = as_user(initdb, run_as)
            .output()
            .map_err(io(format!("running {}", bin.join("initdb").display())))?;
        let _ = std::fs::remove_file(&pwfile);
        if !out.status.success() {
            return Err(Error::Startup {
                component: "initdb".to_owned(),
                reason: format!("exited with {}", out.status),
                log: log_dir.clone(),
                log_dir: log_dir.clone(),
                tail: format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        let cert = data.join("server.crt");
        let key = data.join("server.key");
        serving.write(&cert, &key)?;
        if let Some((_, clients)) = &also {
            let hba = data.join("pg_hba.conf");
            let mut text =
                std::fs::read_to_string(&hba).map_err(io(format!("reading {}", hba.display())))?;
            text.push_str(&format!("host all all {clients} scram-sha-256\n"));
            std::fs::write(&hba, text).map_err(io(format!("writing {}", hba.display())))?;
        }
        if let Some((uid, gid)) = run_as {
            chown_tree(&data, uid, gid)?;
        }
        let mut pg = Postgres {
            bin,
            root,
            data,
            log_dir,
            port: free_port()?,
            password,
            ca_pem: ca.cert_pem().to_owned(),
            run_as,
            component: None,
            starts: 0,
            also,
        };
        // The port was free a moment ago; another process may have bound it since.
        // Then the server exits at once, having changed nothing: try another port.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match pg.start_again().await {
                Err(Error::Startup { tail, .. }) if attempt < 3 && lost_the_port(&tail) => {
                    eprintln!(
                        "harness: PostgreSQL's port {} was taken meanwhile; starting again",
                        pg.port
                    );
                    pg.port = free_port()?;
                }
                other => return other.map(|()| pg),
            }
        }
    }

    /// Starts the server again on the same data and port after [`Postgres::stop`]
    /// (a no-op while it runs).
    pub async fn start_again(&mut self) -> Result<()> {
        if self.component.is_some() {
            return Ok(());
        }
        self.starts += 1;
        let socket_dir = self.root.join("socket");
        let args: Vec<String> = [
            "-D".to_owned(),
            self.data.display().to_string(),
            "-p".to_owned(),
            self.port.to_string(),
            "-k".to_owned(),
            socket_dir.display().to_string(),
            "-c".to_owned(),
            format!(
                "listen_addresses=127.0.0.1{}",
                self.also
                    .as_ref()
                    .map_or(String::new(), |(address, _)| format!(",{address}"))
            ),
            "-c".to_owned(),
            "ssl=on".to_owned(),
            "-c".to_owned(),
            "ssl_cert_file=server.crt".to_owned(),
            "-c".to_owned(),
            "ssl_key_file=server.key".to_owned(),
            "-c".to_owned(),
            "max_connections=200".to_owned(),
            // Throw-away data: durability buys nothing and costs time on a small machine.
            "-c".to_owned(),
            "fsync=off".to_owned(),
            "-c".to_owned(),
            "synchronous_commit=off".to_owned(),
            "-c".to_owned(),
            "full_page_writes=off".to_owned(),
        ]
        .into();
        let (program, args) = match self.run_as {
            Some((uid, gid)) => {
                let mut all = vec![
                    format!("--reuid={uid}"),
                    format!("--regid={gid}"),
                    "--clear-groups".to_owned(),
                    "--".to_owned(),
                    self.bin.join("postgres").display().to_string(),
                ];
                all.extend(args);
                (PathBuf::from("setpriv"), all)
            }
            None => (self.bin.join("postgres"), args),
        };
        let component = Component::spawn(Spec {
            name: &format!("postgres-{}", self.starts),
            program: &program,
            args,
            log_dir: &self.log_dir,
            // The data must survive a restart; Drop removes it.
            remove_after_exit: None,
        })?;
        self.component = Some(component);
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(c) = self.component.as_mut()
                && let Some(status) = c.exited()
            {
                let err = c.startup_error(format!("exited with {status}"), &self.log_dir);
                self.component = None;
                return Err(err);
            }
            if let Ok(Ok(_)) =
                tokio::time::timeout(Duration::from_secs(2), self.connect_admin()).await
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: "PostgreSQL to accept a TLS login".to_owned(),
                    timeout: START_TIMEOUT,
                    log_dir: self.log_dir.clone(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the server (fast shutdown: sessions are terminated). Connections fail
    /// until [`Postgres::start_again`].
    pub fn stop(&mut self) {
        let Some(mut component) = self.component.take() else {
            return;
        };
        let mut pg_ctl = Command::new(self.bin.join("pg_ctl"));
        pg_ctl
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "-t", "30", "stop"]);
        let _ = as_user(pg_ctl, self.run_as).output();
        // The wrapper has seen the server exit; if pg_ctl failed, this kills it.
        component.stop(Duration::from_secs(10));
    }

    /// Whether the server is running (not stopped).
    pub fn is_running(&self) -> bool {
        self.component.is_some()
    }

    pub fn host(&self) -> &str {
        "127.0.0.1"
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The superuser's password.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// PEM of the CA that signed the server's certificate (valid for `localhost`,
    /// `127.0.0.1` and `::1`).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Serves a certificate from a new CA (valid for the same names) from now on, as a
    /// server whose CA is rotated does: the files are replaced and the configuration
    /// reloaded, sessions already open keep theirs. Returns once a verify-full login
    /// with the new CA ([`Postgres::ca_pem`]) works; a client holding only the old CA
    /// fails from then on.
    pub async fn rotate_ca(&mut self) -> Result<()> {
        let admin = self.connect_admin().await?;
        let ca = certs::Ca::new("appservice-tests PostgreSQL CA (rotated)")?;
        let serving = ca.serving_cert(&names(self.also.as_ref()))?;
        let (cert, key) = (self.data.join("server.crt"), self.data.join("server.key"));
        serving.write(&cert, &key)?;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
            .map_err(io(format!("chmod {}", key.display())))?;
        if let Some((uid, gid)) = self.run_as {
            for file in [&cert, &key] {
                std::os::unix::fs::chown(file, Some(uid), Some(gid))
                    .map_err(io(format!("chown {}", file.display())))?;
            }
        }
        admin
            .query_one("SELECT pg_reload_conf()", &[])
            .await
            .map_err(|e| Error::Postgres(format!("reloading the configuration: {e}")))?;
        self.ca_pem = ca.cert_pem().to_owned();
        // The postmaster reloads on the signal, a moment later.
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match tokio::time::timeout(Duration::from_secs(2), self.connect_admin()).await {
                Ok(Ok(_)) => return Ok(()),
                _ if Instant::now() > deadline => {
                    return Err(Error::Timeout {
                        what: "PostgreSQL to serve the rotated CA's certificate".to_owned(),
                        timeout: START_TIMEOUT,
                        log_dir: self.log_dir.clone(),
                    });
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Where the server's logs are.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    /// Everything the server logged since it was first started (every start's log), as
    /// text (bytes that are not UTF-8 replaced). With `log_statement = 'all'` this is
    /// every statement any client sent.
    pub fn server_log(&self) -> Result<String> {
        let mut all = Vec::new();
        for start in 1..=self.starts {
            let path = self.log_dir.join(format!("postgres-{start}.log"));
            match std::fs::read(&path) {
                Ok(bytes) => all.extend(bytes),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(format!("reading {}", path.display()))(e)),
            }
        }
        Ok(String::from_utf8_lossy(&all).into_owned())
    }

    /// The end of the current server log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(
            &self.log_dir.join(format!("postgres-{}.log", self.starts)),
            lines,
        )
    }

    /// A TLS (verify-full) client logged in as the superuser to database `postgres`.
    pub async fn connect_admin(&self) -> Result<tokio_postgres::Client> {
        self.connect(SUPERUSER, &self.password, "postgres").await
    }

    /// A TLS (verify-full) client logged in as `user` to `database`.
    pub async fn connect(
        &self,
        user: &str,
        password: &str,
        database: &str,
    ) -> Result<tokio_postgres::Client> {
        let mut config = tokio_postgres::Config::new();
        config
            .host(self.host())
            .port(self.port)
            .user(user)
            .password(password)
            .dbname(database)
            .ssl_mode(SslMode::Require)
            .connect_timeout(Duration::from_secs(5));
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(self.tls_config()?);
        let (client, connection) = config.connect(tls).await.map_err(|e| {
            // tokio-postgres's Display of a server error is only "db error": say
            // what the server said (SQLSTATE and message).
            let detail = match e.as_db_error() {
                Some(db) => format!("{}: {}", db.code().code(), db.message()),
                None => e.to_string(),
            };
            Error::Postgres(format!("login of {user} to {database}: {detail}"))
        })?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    fn tls_config(&self) -> Result<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut self.ca_pem.as_bytes()) {
            let cert = cert.map_err(io("parsing the PostgreSQL CA"))?;
            roots
                .add(cert)
                .map_err(|e| Error::Postgres(format!("adding the PostgreSQL CA: {e}")))?;
        }
        Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Postgres(format!("TLS versions: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
    }
}

/// `cmd` run as `run_as` through setpriv, when set.
fn as_user(cmd: Command, run_as: Option<(u32, u32)>) -> Command {
    let Some((uid, gid)) = run_as else {
        return cmd;
    };
    let mut wrapped = Command::new("setpriv");
    wrapped
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .arg("--")
        .arg(cmd.get_program())
        .args(cmd.get_args());
    wrapped
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // A fast shutdown lets the postmaster reap its backends; the wrapper's SIGKILL
        // (all that is left when the test process dies) leaves them to init.
        self.stop();
        if std::env::var_os("APPSERVICE_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_dir_all(&self.data);
        }
    }
}

/// The names the server's certificate is valid for.
fn names(also: Option<&(String, String)>) -> Vec<String> {
    let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(str::to_owned).into();
    names.extend(also.map(|(address, _)| address.clone()));
    names
}
