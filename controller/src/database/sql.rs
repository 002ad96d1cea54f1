//! The PostgreSQL side as pure functions: names derived from the AppService UID, the
//! statements that create and drop them, and what a server error means.
//!
//! Utility statements (`CREATE ROLE`, `CREATE DATABASE`, ...) take no bind parameters,
//! so identifiers and literals are quoted here; names come from the UID and passwords
//! from [`new_password`], so neither ever holds a quote, and quoting is defence in depth.

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

/// A new password from the operating system's CSPRNG-seeded generator.
pub fn new_password() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), PASSWORD_LEN)
}

/// `"name"` with embedded quotes doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'value'` with embedded quotes doubled.
pub fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

pub fn create_role(role: &str, password: &str) -> String {
    format!(
        "CREATE ROLE {} LOGIN PASSWORD {}",
        quote_ident(role),
        quote_literal(password)
    )
}

pub fn set_password(role: &str, password: &str) -> String {
    format!(
        "ALTER ROLE {} WITH LOGIN PASSWORD {}",
        quote_ident(role),
        quote_literal(password)
    )
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

pub fn drop_role(role: &str) -> String {
    format!("DROP ROLE IF EXISTS {}", quote_ident(role))
}

pub const ROLE_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)";
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
    fn quoting_doubles_quotes() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(
            create_role("r", "p'w"),
            "CREATE ROLE \"r\" LOGIN PASSWORD 'p''w'"
        );
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
