//! `--namespace-selector`: which namespaces a ring owns, in the label selector syntax of
//! `kubectl -l` (`operator-upgrade=canary`, `operator-upgrade!=canary`,
//! `tier in (a,b)`, `tier notin (a,b)`, `key`, `!key`, joined by commas). Two releases
//! split the namespaces between them with complementary selectors; the rings' Leases
//! keep the split exclusive even while a namespace's labels move (the controller's
//! sharding crate, `rings`). Parsed once at start-up: a selector that does not parse stops the
//! process with the reason.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use kube::core::{Expression, Selector, SelectorExt};

/// A parsed namespace selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceSelector {
    text: String,
    selector: Selector,
}

impl NamespaceSelector {
    /// Parses `text`; the error says which requirement is wrong and why.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.len() > MAX_LEN {
            return Err(format!(
                "namespace selector of {} bytes (at most {MAX_LEN})",
                text.len()
            ));
        }
        let requirements = split(text)?;
        if requirements.is_empty() {
            return Err(
                "empty namespace selector (leave the flag out to own every namespace)".into(),
            );
        }
        let expressions = requirements
            .iter()
            .map(|r| requirement(r).map_err(|e| format!("namespace selector {text:?}: {r:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(NamespaceSelector {
            text: text.trim().to_owned(),
            selector: expressions.into_iter().collect(),
        })
    }

    /// Whether a namespace with `labels` is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.matches(labels)
    }
}

impl fmt::Display for NamespaceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The longest selector accepted (a flag, not a document).
pub const MAX_LEN: usize = 4096;

/// Splits at the commas outside parentheses; every requirement must be non-empty.
fn split(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0u32, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' if depth == 0 => depth = 1,
            '(' => return Err(format!("namespace selector {text:?}: nested '('")),
            ')' if depth == 1 => depth = 0,
            ')' => return Err(format!("namespace selector {text:?}: ')' without '('")),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("namespace selector {text:?}: '(' not closed"));
    }
    parts.push(&text[start..]);
    if parts.len() == 1 && parts[0].trim().is_empty() {
        return Ok(Vec::new());
    }
    let parts: Vec<&str> = parts.into_iter().map(str::trim).collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(format!("namespace selector {text:?}: an empty requirement"));
    }
    Ok(parts)
}

fn requirement(r: &str) -> Result<Expression, String> {
    if let Some(key) = r.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(key_of(key.trim())?));
    }
    for (op, notin) in [(" notin ", true), (" in ", false)] {
        if let Some((key, set)) = r.split_once(op) {
            let key = key_of(key.trim())?;
            let set = set_of(set.trim())?;
            return Ok(if notin {
                Expression::NotIn(key, set)
            } else {
                Expression::In(key, set)
            });
        }
    }
    if let Some((key, value)) = r.split_once("!=") {
        return Ok(Expression::NotEqual(
            key_of(key.trim())?,
            value_of(value.trim())?,
        ));
    }
    if let Some((key, value)) = r.split_once("==").or_else(|| r.split_once('=')) {
        return Ok(Expression::Equal(
            key_of(key.trim())?,
            value_of(value.trim())?,
        ));
    }
    Ok(Expression::Exists(key_of(r)?))
}

fn set_of(text: &str) -> Result<BTreeSet<String>, String> {
    let inner = text
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .ok_or("a set is written (a,b)")?;
    let values = inner
        .split(',')
        .map(|v| value_of(v.trim()))
        .collect::<Result<BTreeSet<_>, _>>()?;
    if values.iter().all(String::is_empty) {
        return Err("an empty set".into());
    }
    Ok(values)
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters (alphanumerics, `-`, `_`, `.`; alphanumeric at both ends).
fn key_of(key: &str) -> Result<String, String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if p.is_empty() || p.len() > 253 || !p.split('.').all(label_ok) {
            return Err(format!("{p:?} is not a DNS subdomain (the key's prefix)"));
        }
    }
    if !is_label_value(name) {
        return Err(format!("{key:?} is not a label key"));
    }
    Ok(key.to_owned())
}

fn value_of(value: &str) -> Result<String, String> {
    if value.is_empty() || is_label_value(value) {
        Ok(value.to_owned())
    } else {
        Err(format!("{value:?} is not a label value"))
    }
}

/// Whether `value` can be a label value (the shard's identity must be one).
pub fn is_label_value(value: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    !value.is_empty()
        && value.len() <= 63
        && value.chars().all(ok_char)
        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn complementary_selectors_split_every_namespace_between_two_rings() {
        let canary = NamespaceSelector::parse("operator-upgrade=canary").unwrap();
        let main = NamespaceSelector::parse("operator-upgrade!=canary").unwrap();
        for ns in [
            labels(&[]),
            labels(&[("operator-upgrade", "canary")]),
            labels(&[("operator-upgrade", "stable")]),
            labels(&[("team", "a")]),
        ] {
            assert_ne!(canary.matches(&ns), main.matches(&ns), "{ns:?}");
        }
    }

    #[test]
    fn every_operator_of_the_syntax_parses_and_matches() {
        let s = NamespaceSelector::parse(
            "platform.example.com/tier in (gold, silver), env notin (dev), team, !legacy, a==b",
        )
        .unwrap();
        let ok = labels(&[
            ("platform.example.com/tier", "gold"),
            ("env", "prod"),
            ("team", "x"),
            ("a", "b"),
        ]);
        assert!(s.matches(&ok));
        let mut legacy = ok.clone();
        legacy.insert("legacy".into(), String::new());
        assert!(!s.matches(&legacy));
        let mut dev = ok.clone();
        dev.insert("env".into(), "dev".into());
        assert!(!s.matches(&dev));
        let mut bronze = ok;
        bronze.insert("platform.example.com/tier".into(), "bronze".into());
        assert!(!s.matches(&bronze));
        assert_eq!(
            s.to_string(),
            "platform.example.com/tier in (gold, silver), env notin (dev), team, !legacy, a==b"
        );
    }

    #[test]
    fn malformed_selectors_are_refused_with_the_reason() {
        for (bad, why) in [
            ("", "empty"),
            ("  ", "empty"),
            ("a=b,,c", "empty requirement"),
            ("a=b,", "empty requirement"),
            ("tier in (a,b", "not closed"),
            ("tier in a,b)", "without '('"),
            ("tier in ((a))", "nested"),
            ("tier in ()", "empty set"),
            ("tier in a", "(a,b)"),
            ("-bad=x", "label key"),
            ("a b=c", "label key"),
            ("Bad_Prefix/x=y", "DNS subdomain"),
            ("/x=y", "DNS subdomain"),
            ("k=bad value", "label value"),
            ("k!=-x", "label value"),
            ("!", "label key"),
        ] {
            let err = NamespaceSelector::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        let huge = format!("k in ({})", vec!["v"; MAX_LEN].join(","));
        assert!(
            NamespaceSelector::parse(&huge)
                .unwrap_err()
                .contains("at most")
        );
    }

    #[test]
    fn an_equality_may_ask_for_an_empty_value() {
        let s = NamespaceSelector::parse("flag=").unwrap();
        assert!(s.matches(&labels(&[("flag", "")])));
        assert!(!s.matches(&labels(&[("flag", "x")])));
        assert!(!s.matches(&labels(&[])));
    }
}
