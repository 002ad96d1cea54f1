//! The PostgreSQL side as pure functions: names derived from the AppService UID, the
//! statements that create and drop them, and what a server error means.
//!
//! Utility statements (`CREATE ROLE`, `CREATE DATABASE`, ...) take no bind parameters,
//! so identifiers and literals are quoted here. Nothing a tenant typed reaches them:
//! names come from the UID, a password only as a [`Verifier`] (SCRAM-SHA-256, computed
//! here; its characters are checked before it is formatted into a statement), and the
//! database comment from Kubernetes names (DNS labels). Every session runs with
//! `standard_conforming_strings=on` (set at connect, `connect.rs`), so doubling quotes
//! is the complete quoting of a literal, whatever the server's default.

use rand::distr::{Alphanumeric, SampleString};
use tokio_postgres::error::SqlState;

/// Prefix of every role and database the controller creates; the leak check and admins
/// find them by it.
pub const NAME_PREFIX: &str = "appsvc_";
/// Length of generated passwords (alphanumeric, about 190 bits).
pub const PASSWORD_LEN: usize = 32;

/// Role and database name of an AppService: `appsvc_` + its UID without dashes. The UID
/// never changes and is never reused, so a retry or a second controller arrives at the
/// same name, and a new AppService of the same name gets a new database.
pub fn db_name(uid: &str) -> String {
    let hex: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    format!("{NAME_PREFIX}{hex}")
}

/// The UID (hex, without dashes) a role or database name stands for, if `name` has the
/// shape [`db_name`] gives: the prefix and 32 lowercase hex digits.
pub fn uid_hex_of(name: &str) -> Option<&str> {
    let hex = name.strip_prefix(NAME_PREFIX)?;
    (hex.len() == 32
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then_some(hex)
}

/// Every role and database named like ours (at most `$1` of them), with whether the role
/// may log in (NULL: no such role) and whether the database exists. `\_` is a literal
/// underscore (`standard_conforming_strings` is on for our sessions).
pub const OWN_OBJECTS: &str = "SELECT coalesce(r.rolname, d.datname)::text, r.rolcanlogin, d.datname IS NOT NULL \
     FROM pg_roles r FULL OUTER JOIN pg_database d ON d.datname = r.rolname \
     WHERE coalesce(r.rolname, d.datname) LIKE 'appsvc\\_%' ORDER BY 1 LIMIT $1";

/// A new password from the operating system's CSPRNG-seeded generator.
pub fn new_password() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), PASSWORD_LEN)
}

/// Whether `password` has the shape of one [`new_password`] makes (exactly
/// [`PASSWORD_LEN`] ASCII alphanumerics). Any other text in the credentials Secret (a
/// tenant's edit: quotes, backslashes, NUL, kilobytes, ...) is not taken as the role's
/// password: the controller replaces it with a generated one. A value of this shape
/// that a tenant chose is accepted (the role is theirs), and still reaches the server
/// only as a [`Verifier`].
pub fn is_generated_shape(password: &str) -> bool {
    password.len() == PASSWORD_LEN && password.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// A SCRAM-SHA-256 password verifier (RFC 5802/7677, as PostgreSQL stores it:
/// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`), computed on our side so
/// that the plaintext never appears in a statement, the server's log or
/// `pg_stat_activity`. The server stores a verifier given to `PASSWORD` as is.
#[derive(Clone, PartialEq, Eq)]
pub struct Verifier(String);

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Verifier([elided])")
    }
}

/// A verifier that is not in the expected form (never the case for ours).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a SCRAM-SHA-256 verifier of the expected form")]
pub struct NotAVerifier;

impl Verifier {
    /// The verifier of `password` with a random 16-byte salt and 4096 iterations
    /// (`postgres-protocol`, which applies SASLprep as libpq's `PQencryptPasswordConn`
    /// and the server do).
    pub fn of(password: &str) -> Result<Verifier, NotAVerifier> {
        Verifier::parse(postgres_protocol::password::scram_sha_256(
            password.as_bytes(),
        ))
    }

    /// `text` if it is a verifier of the form above: the prefix, decimal iterations,
    /// and three base64 fields, nothing else (no quote, backslash or space can follow
    /// into a statement).
    pub fn parse(text: String) -> Result<Verifier, NotAVerifier> {
        let rest = text.strip_prefix("SCRAM-SHA-256$").ok_or(NotAVerifier)?;
        let (params, keys) = rest.split_once('$').ok_or(NotAVerifier)?;
        let (iterations, salt) = params.split_once(':').ok_or(NotAVerifier)?;
        let (stored, server) = keys.split_once(':').ok_or(NotAVerifier)?;
        let base64 = |f: &str| {
            !f.is_empty()
                && f.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=')
        };
        let ok = !iterations.is_empty()
            && iterations.bytes().all(|b| b.is_ascii_digit())
            && [salt, stored, server].into_iter().all(base64);
        if ok {
            Ok(Verifier(text))
        } else {
            Err(NotAVerifier)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `"name"` with embedded quotes doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'value'` with embedded quotes doubled.
pub fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

pub fn create_role(role: &str, password: &Verifier, connection_limit: i32) -> String {
    format!(
        "CREATE ROLE {} LOGIN CONNECTION LIMIT {connection_limit} PASSWORD {}",
        quote_ident(role),
        quote_literal(password.as_str())
    )
}

pub fn set_password(role: &str, password: &Verifier) -> String {
    format!(
        "ALTER ROLE {} WITH PASSWORD {}",
        quote_ident(role),
        quote_literal(password.as_str())
    )
}

/// LOGIN and the class's connection limit back on a role that drifted (or lost LOGIN
/// under `Retain` and is wanted again).
pub fn set_login(role: &str, connection_limit: i32) -> String {
    format!(
        "ALTER ROLE {} WITH LOGIN CONNECTION LIMIT {connection_limit}",
        quote_ident(role)
    )
}

/// `Retain`: the role stays (it owns the kept database) but can no longer log in.
pub fn retire_role(role: &str) -> String {
    format!("ALTER ROLE {} WITH NOLOGIN", quote_ident(role))
}

pub fn create_database(db: &str, owner: &str) -> String {
    format!(
        "CREATE DATABASE {} OWNER {}",
        quote_ident(db),
        quote_ident(owner)
    )
}

pub fn revoke_public_connect(db: &str) -> String {
    format!("REVOKE CONNECT ON DATABASE {} FROM PUBLIC", quote_ident(db))
}

pub fn comment_database(db: &str, comment: &str) -> String {
    format!(
        "COMMENT ON DATABASE {} IS {}",
        quote_ident(db),
        quote_literal(comment)
    )
}

/// Ends every session on `$1` but our own, so the database can be dropped.
pub const TERMINATE_SESSIONS: &str = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()";

pub fn drop_database(db: &str) -> String {
    // FORCE (PostgreSQL 13+) also ends sessions that connected after TERMINATE_SESSIONS.
    format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quote_ident(db))
}

/// Ends every session of the role `$1` but our own (after NOLOGIN, nothing new comes).
pub const TERMINATE_ROLE_SESSIONS: &str = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = $1 AND pid <> pg_backend_pid()";

pub fn drop_role(role: &str) -> String {
    format!("DROP ROLE IF EXISTS {}", quote_ident(role))
}

/// Whether the role `$1` may log in, and its connection limit (no row: no such role).
pub const ROLE_STATE: &str = "SELECT rolcanlogin, rolconnlimit FROM pg_roles WHERE rolname = $1";
pub const DATABASE_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)";
/// Whether PUBLIC may still connect to `$1` (an ACL that is NULL means the default,
/// which grants CONNECT to PUBLIC).
pub const PUBLIC_MAY_CONNECT: &str = "SELECT has_database_privilege('public', $1, 'CONNECT')";

/// What a failed statement or login means for the controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The admin login was refused: wrong user or password, or no such user.
    Credentials,
    /// The admin may not do this (no CREATEROLE/CREATEDB).
    Privilege,
    /// Another session created the same object first: the goal holds.
    AlreadyExists,
    /// No connection, or the server is starting up or shutting down: retry later.
    Unavailable,
    /// Anything else the server said.
    Other,
}

/// Classifies an SQLSTATE (`None`: no answer from the server at all).
pub fn classify(code: Option<&SqlState>) -> Failure {
    let Some(code) = code else {
        return Failure::Unavailable;
    };
    if *code == SqlState::INVALID_PASSWORD || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
    {
        Failure::Credentials
    } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
        Failure::Privilege
    } else if *code == SqlState::DUPLICATE_OBJECT
        || *code == SqlState::DUPLICATE_DATABASE
        // Two sessions creating the same role or database at once: the loser trips over
        // the catalog's unique index instead of the duplicate check.
        || *code == SqlState::UNIQUE_VIOLATION
    {
        Failure::AlreadyExists
    } else if code.code().starts_with("08")
        || code.code().starts_with("57P")
        || *code == SqlState::TOO_MANY_CONNECTIONS
        || *code == SqlState::QUERY_CANCELED
    {
        // Connection exceptions, admin/crash shutdown, cannot connect now, statement
        // timeout: the server is (for the moment) not usable.
        Failure::Unavailable
    } else {
        Failure::Other
    }
}

/// `postgres://user:password@host:port/db?sslmode=...`. The user and database names
/// are generated alphanumerics and the password alphanumeric, so nothing needs escaping
/// except an IPv6 host, which gets brackets.
pub fn database_url(
    user: &str,
    password: &str,
    host: &str,
    port: i32,
    db: &str,
    sslmode: &str,
) -> String {
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    format!("postgres://{user}:{password}@{host}:{port}/{db}?sslmode={sslmode}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_of_our_shape_stand_for_a_uid() {
        let name = db_name("0f3c2a1b-9d8e-4f7a-b6c5-d4e3f2a1b0c9");
        assert_eq!(uid_hex_of(&name), Some("0f3c2a1b9d8e4f7ab6c5d4e3f2a1b0c9"));
        for other in [
            "appsvc_",
            "appsvc_0f3c2a1b9d8e4f7ab6c5d4e3f2a1b0c",
            "appsvc_0f3c2a1b9d8e4f7ab6c5d4e3f2a1b0c9a",
            "appsvc_0F3C2A1B9D8E4F7AB6C5D4E3F2A1B0C9",
            "appsvc_0f3c2a1b9d8e4f7ab6c5d4e3f2a1b0cz",
            "appsvcx0f3c2a1b9d8e4f7ab6c5d4e3f2a1b0c9",
            "postgres",
        ] {
            assert_eq!(uid_hex_of(other), None, "{other}");
        }
        assert!(OWN_OBJECTS.contains(r"LIKE 'appsvc\_%'"), "{OWN_OBJECTS}");
    }

    #[test]
    fn names_are_deterministic_valid_identifiers() {
        let uid = "0f3c2a1b-9d8e-4f7a-b6c5-d4e3f2a1b0c9";
        let name = db_name(uid);
        assert_eq!(name, "appsvc_0f3c2a1b9d8e4f7ab6c5d4e3f2a1b0c9");
        assert_eq!(db_name(uid), name);
        assert!(
            name.len() <= 63,
            "PostgreSQL truncates identifiers at 63 bytes"
        );
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        );
    }

    #[test]
    fn passwords_are_long_random_alphanumerics() {
        let a = new_password();
        let b = new_password();
        assert_eq!(a.len(), PASSWORD_LEN);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }

    #[test]
    fn generated_shape_is_exactly_what_new_password_makes() {
        assert!(is_generated_shape(&new_password()));
        let shaped = "a".repeat(PASSWORD_LEN);
        assert!(is_generated_shape(&shaped));
        for hostile in [
            String::new(),
            "a".repeat(PASSWORD_LEN - 1),
            "a".repeat(PASSWORD_LEN + 1),
            format!("{}'", "a".repeat(PASSWORD_LEN - 1)),
            format!("{}\\", "a".repeat(PASSWORD_LEN - 1)),
            format!("{};", "a".repeat(PASSWORD_LEN - 1)),
            format!("{}\0", "a".repeat(PASSWORD_LEN - 1)),
            format!("{}é", "a".repeat(PASSWORD_LEN - 2)),
            "x".repeat(10 * 1024),
        ] {
            assert!(!is_generated_shape(&hostile), "{hostile:?}");
        }
    }

    #[test]
    fn verifiers_are_scram_sha_256_with_a_fresh_salt() {
        let a = Verifier::of("pencil").unwrap();
        let b = Verifier::of("pencil").unwrap();
        assert_ne!(a, b, "a random salt each time");
        let text = a.as_str();
        assert!(text.starts_with("SCRAM-SHA-256$4096:"), "{text}");
        let (params, keys) = text["SCRAM-SHA-256$".len()..].split_once('$').unwrap();
        let salt = params.split_once(':').unwrap().1;
        let (stored, server) = keys.split_once(':').unwrap();
        // 16 bytes of salt, two SHA-256 outputs, in base64.
        assert_eq!(salt.len(), 24);
        assert_eq!(stored.len(), 44);
        assert_eq!(server.len(), 44);
        assert!(!format!("{a:?}").contains(text), "Debug hides it");
        // Even a hostile plaintext gives a verifier of the safe alphabet.
        let hostile = Verifier::of("'; DROP ROLE x; --\\\0").unwrap();
        assert!(!hostile.as_str().contains(['\'', '\\', ';', ' ', '\0']));
    }

    #[test]
    fn only_well_formed_verifiers_are_accepted() {
        let good = Verifier::of("pw").unwrap().as_str().to_owned();
        assert!(Verifier::parse(good.clone()).is_ok());
        for bad in [
            "plaintext".to_owned(),
            "SCRAM-SHA-256$4096:c2FsdA==$a:b'".to_owned(),
            "SCRAM-SHA-256$4096:c2FsdA==$a:b\\".to_owned(),
            "SCRAM-SHA-256$40 96:c2FsdA==$a:b".to_owned(),
            "SCRAM-SHA-256$4096:$a:b".to_owned(),
            "SCRAM-SHA-256$4096:c2FsdA==$a".to_owned(),
            "md5abc".to_owned(),
            format!("{good}'"),
        ] {
            assert_eq!(Verifier::parse(bad.clone()), Err(NotAVerifier), "{bad}");
        }
    }

    #[test]
    fn quoting_doubles_quotes() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
        let v = Verifier::parse("SCRAM-SHA-256$4096:c2FsdA==$YQ==:Yg==".to_owned()).unwrap();
        assert_eq!(
            create_role("r", &v, 7),
            "CREATE ROLE \"r\" LOGIN CONNECTION LIMIT 7 PASSWORD 'SCRAM-SHA-256$4096:c2FsdA==$YQ==:Yg=='"
        );
        assert_eq!(
            set_login("r", 7),
            "ALTER ROLE \"r\" WITH LOGIN CONNECTION LIMIT 7"
        );
        assert_eq!(retire_role("r"), "ALTER ROLE \"r\" WITH NOLOGIN");
        assert_eq!(
            drop_database("d"),
            "DROP DATABASE IF EXISTS \"d\" WITH (FORCE)"
        );
    }

    #[test]
    fn failures_are_classified() {
        assert_eq!(classify(None), Failure::Unavailable);
        assert_eq!(
            classify(Some(&SqlState::INVALID_PASSWORD)),
            Failure::Credentials
        );
        assert_eq!(
            classify(Some(&SqlState::DUPLICATE_OBJECT)),
            Failure::AlreadyExists
        );
        assert_eq!(
            classify(Some(&SqlState::DUPLICATE_DATABASE)),
            Failure::AlreadyExists
        );
        assert_eq!(
            classify(Some(&SqlState::UNIQUE_VIOLATION)),
            Failure::AlreadyExists
        );
        assert_eq!(
            classify(Some(&SqlState::ADMIN_SHUTDOWN)),
            Failure::Unavailable
        );
        assert_eq!(
            classify(Some(&SqlState::CANNOT_CONNECT_NOW)),
            Failure::Unavailable
        );
        assert_eq!(
            classify(Some(&SqlState::INSUFFICIENT_PRIVILEGE)),
            Failure::Privilege
        );
        assert_eq!(classify(Some(&SqlState::SYNTAX_ERROR)), Failure::Other);
    }

    #[test]
    fn urls() {
        assert_eq!(
            database_url("u", "p", "db.example", 5432, "d", "verify-full"),
            "postgres://u:p@db.example:5432/d?sslmode=verify-full"
        );
        assert_eq!(
            database_url("u", "p", "::1", 5432, "d", "disable"),
            "postgres://u:p@[::1]:5432/d?sslmode=disable"
        );
    }
}
