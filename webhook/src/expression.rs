//! One CEL expression of a policy, compiled once: checked, rewritten, analysed and
//! evaluated the way the API server's ValidatingAdmissionPolicy does it.
//!
//! * **Checks at load.** Only the bound variables may be referenced; comprehension
//!   variables (`all`, `exists`, `exists_one`, `map`, `filter`), `cel.bind` names and
//!   library namespaces (`sets.contains`, `math.abs`, `strings.quote`, ...) are not
//!   variables. Runs of unary operators (`!!x`, `--1`) are refused: the parser of the
//!   `cel` crate 0.13 (the one kube-cel builds on) drops an even run of them and would
//!   evaluate `!!true` to `false`. Struct literals are refused (the interpreter cannot
//!   evaluate them).
//! * **`cel.bind(name, init, body)`** is rewritten into the comprehension CEL-Go uses
//!   for it (no iteration, the accumulator is `name`).
//! * **Projection.** The fields of `object` and `oldObject` the expression reads
//!   (`object.spec.env`, `object.metadata.labels`, ...), so a request converts only
//!   those to CEL values.
//! * **Cost.** A worst-case estimate in the spirit of the API server's estimator:
//!   every node costs 1, a comprehension costs its body times the largest size its
//!   list can have (`spec.env` at most 128 entries, any other list of an object at most
//!   [`crate::review::MAX_POLICY_VALUES`] values). A policy over the budget is refused.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use kube::core::cel::KubeCelExt;
use kube::core::cel::cel::common::ast::{EntryExpr, Expr, IdedExpr};
use kube::core::cel::cel::objects::{Key, Map};
use kube::core::cel::cel::{Context, ExecutionError, Program, Value};
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::review::{MAX_POLICY_VALUES, MAX_RESOURCE_ENTRIES};

/// Cost limit of one expression, as the API server's per-expression limit.
pub const PER_EXPRESSION_COST_LIMIT: u64 = 1_000_000;
/// Cost limit of all policies of one review, as the API server's runtime budget of one
/// ValidatingAdmissionPolicy evaluation.
pub const PER_REVIEW_COST_LIMIT: u64 = 10_000_000;

/// Library namespaces of Kubernetes' CEL: `ns.function(...)` is a call, not a variable.
const NAMESPACES: [&str; 10] = [
    "base64",
    "cel",
    "format",
    "ip",
    "jsonpatch",
    "lists",
    "math",
    "optional",
    "sets",
    "strings",
];

/// The paths of an object an expression reads: a field set, or the whole value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Projection {
    whole: bool,
    fields: BTreeMap<String, Projection>,
}

impl Projection {
    /// Everything.
    pub fn whole() -> Self {
        Projection {
            whole: true,
            fields: BTreeMap::new(),
        }
    }

    /// Nothing: the variable is not read.
    pub fn is_empty(&self) -> bool {
        !self.whole && self.fields.is_empty()
    }

    fn add(&mut self, path: &[String]) {
        if self.whole {
            return;
        }
        match path.split_first() {
            None => {
                self.whole = true;
                self.fields.clear();
            }
            Some((first, rest)) => self.fields.entry(first.clone()).or_default().add(rest),
        }
    }

    /// Adds everything `other` reads.
    pub fn merge(&mut self, other: &Projection) {
        if self.whole {
            return;
        }
        if other.whole {
            *self = Projection::whole();
            return;
        }
        for (field, sub) in &other.fields {
            self.fields.entry(field.clone()).or_default().merge(sub);
        }
    }

    /// What is read under `field` (`None`: nothing).
    fn child(&self, field: &str) -> Option<&Projection> {
        if self.whole {
            Some(self)
        } else {
            self.fields.get(field)
        }
    }
}

/// Why an expression was refused, or an object could not be read for it.
#[derive(Debug, thiserror::Error)]
pub enum ExpressionError {
    #[error(
        "a run of unary operators at column {column} ('!!', '--'): the CEL parser in use evaluates it wrong (an even run is dropped); remove the pair or write !(!x), -(-x)"
    )]
    UnaryRun { column: usize },
    /// The CEL parser's own message.
    #[error("{0}")]
    Parse(String),
    #[error("cel.bind takes three arguments: a name, a value and an expression")]
    BindArguments,
    #[error("the first argument of cel.bind must be a name")]
    BindName,
    #[error("cannot expand cel.bind")]
    BindExpansion,
    /// A construct the cost estimate and the projection do not follow.
    #[error("{0} are not supported")]
    Unsupported(&'static str),
    #[error("an empty expression")]
    Empty,
    #[error("undeclared reference to {} (available: {})", unknown.join(", "), available.join(", "))]
    Undeclared {
        unknown: Vec<String>,
        available: Vec<String>,
    },
    #[error("it has more than {max} JSON values, the most policies read")]
    TooManyValues { max: usize },
    #[error("{0}")]
    Json(serde_json::Error),
}

/// Parses `source` with the CEL parser.
fn parse(source: &str) -> Result<Program, ExpressionError> {
    Program::compile(source).map_err(|e| ExpressionError::Parse(e.to_string()))
}

/// A compiled expression.
#[derive(Debug)]
pub struct Expression {
    ast: IdedExpr,
    /// Free variables it references.
    pub variables: BTreeSet<String>,
    pub object: Projection,
    pub old_object: Projection,
    /// Worst-case cost estimate.
    pub cost: u64,
}

impl Expression {
    /// Parses and checks `source`; `variables` are the names that may be referenced.
    pub fn compile(source: &str, variables: &[&str]) -> Result<Expression, ExpressionError> {
        if let Some(column) = unary_run(source) {
            return Err(ExpressionError::UnaryRun { column });
        }
        let program = parse(source)?;
        let mut ast = program.expression().clone();
        rewrite_bind(&mut ast)?;
        let mut analysis = Analysis::default();
        analysis.walk(&ast, &mut Vec::new())?;
        let mut unknown: Vec<String> = analysis
            .variables
            .iter()
            .filter(|v| !variables.contains(&v.as_str()))
            .cloned()
            .collect();
        unknown.sort_unstable();
        if !unknown.is_empty() {
            return Err(ExpressionError::Undeclared {
                unknown,
                available: variables.iter().map(|v| (*v).to_owned()).collect(),
            });
        }
        let cost = estimate(&ast);
        Ok(Expression {
            ast,
            variables: analysis.variables,
            object: analysis.object,
            old_object: analysis.old_object,
            cost,
        })
    }

    /// Evaluates against `context`.
    pub fn evaluate(&self, context: &Context<'_>) -> Result<Value, ExecutionError> {
        Value::resolve(&self.ast, context)
    }
}

/// The column (1-based) of the second operator of the first run of two unary `!` or
/// `-`, outside string literals and comments.
fn unary_run(source: &str) -> Option<usize> {
    let chars: Vec<char> = source.chars().collect();
    let mut i = 0;
    // Whether the previous token ends an operand (so a `-` after it is binary).
    let mut after_operand = false;
    // The previous token, when it was a unary operator.
    let mut last_unary: Option<char> = None;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            '/' if chars.get(i + 1) == Some(&'/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
                continue;
            }
            '"' | '\'' => {
                let raw = i > 0 && matches!(chars[i - 1], 'r' | 'R');
                let triple = chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c);
                i += if triple { 3 } else { 1 };
                while i < chars.len() {
                    if !raw && chars[i] == '\\' {
                        i += 2;
                        continue;
                    }
                    if chars[i] == c
                        && (!triple
                            || (chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c)))
                    {
                        i += if triple { 3 } else { 1 };
                        break;
                    }
                    i += 1;
                }
                after_operand = true;
                last_unary = None;
                continue;
            }
            '!' if chars.get(i + 1) == Some(&'=') => {
                i += 2;
                after_operand = false;
                last_unary = None;
                continue;
            }
            '!' | '-' if !(c == '-' && after_operand) => {
                if last_unary == Some(c) {
                    return Some(i + 1);
                }
                last_unary = Some(c);
                after_operand = false;
            }
            '-' => {
                // Binary minus.
                after_operand = false;
                last_unary = None;
            }
            c if c.is_alphanumeric() || c == '_' || c == ')' || c == ']' || c == '}' => {
                after_operand = true;
                last_unary = None;
            }
            _ => {
                after_operand = false;
                last_unary = None;
            }
        }
        i += 1;
    }
    None
}

/// Rewrites every `cel.bind(name, init, body)` into a comprehension over an empty list
/// whose accumulator is `name`, as CEL-Go expands the macro.
fn rewrite_bind(expr: &mut IdedExpr) -> Result<(), ExpressionError> {
    let bind = match &mut expr.expr {
        Expr::Call(call)
            if call.func_name == "bind"
                && matches!(call.target.as_deref(), Some(IdedExpr { expr: Expr::Ident(ns), .. }) if ns == "cel") =>
        {
            let [name, init, body] = std::mem::take(&mut call.args)
                .try_into()
                .map_err(|_| ExpressionError::BindArguments)?;
            let Expr::Ident(name) = name.expr else {
                return Err(ExpressionError::BindName);
            };
            Some((name, init, body))
        }
        _ => None,
    };
    if let Some((name, mut init, mut body)) = bind {
        rewrite_bind(&mut init)?;
        rewrite_bind(&mut body)?;
        let template = parse("[].all(x, false)")?;
        let mut comprehension = template.expression().clone();
        let Expr::Comprehension(c) = &mut comprehension.expr else {
            return Err(ExpressionError::BindExpansion);
        };
        c.accu_var = name.clone();
        c.accu_init = init;
        c.loop_cond = parse("false")?.expression().clone();
        c.loop_step = IdedExpr {
            id: 0,
            expr: Expr::Ident(name),
        };
        c.result = body;
        c.iter_var = "@bind_unused".to_owned();
        *expr = comprehension;
        return Ok(());
    }
    match &mut expr.expr {
        Expr::Call(call) => {
            if let Some(target) = call.target.as_deref_mut() {
                rewrite_bind(target)?;
            }
            for arg in &mut call.args {
                rewrite_bind(arg)?;
            }
        }
        Expr::Comprehension(c) => {
            for e in [
                &mut c.iter_range,
                &mut c.accu_init,
                &mut c.loop_cond,
                &mut c.loop_step,
                &mut c.result,
            ] {
                rewrite_bind(e)?;
            }
        }
        Expr::List(list) => {
            for e in &mut list.elements {
                rewrite_bind(e)?;
            }
        }
        Expr::Map(map) => {
            for entry in &mut map.entries {
                if let EntryExpr::MapEntry(e) = &mut entry.expr {
                    rewrite_bind(&mut e.key)?;
                    rewrite_bind(&mut e.value)?;
                }
            }
        }
        Expr::Select(select) => rewrite_bind(&mut select.operand)?,
        Expr::Struct(_) | Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
    }
    Ok(())
}

#[derive(Default)]
struct Analysis {
    variables: BTreeSet<String>,
    object: Projection,
    old_object: Projection,
}

impl Analysis {
    fn read(&mut self, root: &str, path: &[String]) {
        match root {
            "object" => self.object.add(path),
            "oldObject" => self.old_object.add(path),
            _ => {}
        }
    }

    fn walk(&mut self, expr: &IdedExpr, bound: &mut Vec<String>) -> Result<(), ExpressionError> {
        match &expr.expr {
            Expr::Ident(name) => {
                if !bound.contains(name) {
                    self.variables.insert(name.clone());
                    self.read(name, &[]);
                }
            }
            Expr::Select(select) => {
                if let Some((root, path)) = select_chain(expr)
                    && !bound.iter().any(|b| b == root)
                {
                    self.variables.insert(root.to_owned());
                    self.read(root, &path);
                    return Ok(());
                }
                self.walk(&select.operand, bound)?;
            }
            Expr::Call(call) => {
                match call.target.as_deref() {
                    Some(IdedExpr {
                        expr: Expr::Ident(ns),
                        ..
                    }) if NAMESPACES.contains(&ns.as_str()) && !bound.contains(ns) => {}
                    Some(target) => self.walk(target, bound)?,
                    None => {}
                }
                for arg in &call.args {
                    self.walk(arg, bound)?;
                }
            }
            Expr::Comprehension(c) => {
                if c.iter_var2.is_some() {
                    return Err(ExpressionError::Unsupported("two-variable comprehensions"));
                }
                self.walk(&c.iter_range, bound)?;
                self.walk(&c.accu_init, bound)?;
                bound.push(c.iter_var.clone());
                bound.push(c.accu_var.clone());
                let inner = [&c.loop_cond, &c.loop_step, &c.result]
                    .into_iter()
                    .try_for_each(|e| self.walk(e, bound));
                bound.pop();
                bound.pop();
                inner?;
            }
            Expr::List(list) => {
                for e in &list.elements {
                    self.walk(e, bound)?;
                }
            }
            Expr::Map(map) => {
                for entry in &map.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(e) => {
                            self.walk(&e.key, bound)?;
                            self.walk(&e.value, bound)?;
                        }
                        EntryExpr::StructField(_) => {
                            return Err(ExpressionError::Unsupported("struct literals"));
                        }
                    }
                }
            }
            Expr::Struct(_) => return Err(ExpressionError::Unsupported("struct literals")),
            Expr::Unspecified => return Err(ExpressionError::Empty),
            Expr::Literal(_) => {}
        }
        Ok(())
    }
}

/// `a.b.c` as (`a`, [`b`, `c`]) when the chain starts at a plain identifier.
fn select_chain(expr: &IdedExpr) -> Option<(&str, Vec<String>)> {
    let mut fields = Vec::new();
    let mut current = expr;
    loop {
        match &current.expr {
            Expr::Select(select) => {
                fields.push(select.field.clone());
                current = &select.operand;
            }
            Expr::Ident(root) => {
                fields.reverse();
                return Some((root.as_str(), fields));
            }
            _ => return None,
        }
    }
}

/// The largest number of elements `expr` can have when it is a list or map.
fn max_len(expr: &IdedExpr) -> u64 {
    let limit = MAX_POLICY_VALUES as u64;
    match &expr.expr {
        Expr::List(list) => list.elements.len() as u64,
        Expr::Map(map) => map.entries.len() as u64,
        Expr::Select(_) => match select_chain(expr) {
            Some(("object" | "oldObject", path)) => {
                let path: Vec<&str> = path.iter().map(String::as_str).collect();
                match path.as_slice() {
                    ["spec", "env"] => common::types::MAX_ENV as u64,
                    ["spec", "resources", "limits" | "requests" | "claims"] => {
                        MAX_RESOURCE_ENTRIES as u64
                    }
                    _ => limit,
                }
            }
            _ => limit,
        },
        // map() and filter() yield at most as many elements as they iterate.
        Expr::Comprehension(c) => max_len(&c.iter_range),
        _ => limit,
    }
}

/// Worst-case cost: 1 per node, comprehension bodies times their range's size.
fn estimate(expr: &IdedExpr) -> u64 {
    let sum = |exprs: &mut dyn Iterator<Item = &IdedExpr>| {
        exprs.fold(0u64, |acc, e| acc.saturating_add(estimate(e)))
    };
    1u64.saturating_add(match &expr.expr {
        Expr::Call(call) => sum(&mut call.target.as_deref().into_iter().chain(call.args.iter())),
        Expr::Comprehension(c) => {
            let per_item = estimate(&c.loop_cond).saturating_add(estimate(&c.loop_step));
            estimate(&c.iter_range)
                .saturating_add(estimate(&c.accu_init))
                .saturating_add(max_len(&c.iter_range).saturating_mul(per_item))
                .saturating_add(estimate(&c.result))
        }
        Expr::List(list) => sum(&mut list.elements.iter()),
        Expr::Map(map) => sum(&mut map.entries.iter().filter_map(|e| match &e.expr {
            EntryExpr::MapEntry(e) => Some(&e.value),
            EntryExpr::StructField(_) => None,
        })),
        Expr::Select(select) => estimate(&select.operand),
        _ => 0,
    })
}

/// The CEL context with the standard and Kubernetes function libraries, built once per
/// thread (registering them is the expensive part of a context).
pub fn with_functions<R>(f: impl FnOnce(&Context<'static>) -> R) -> R {
    thread_local! {
        static FUNCTIONS: Context<'static> = Context::default().with_all();
    }
    FUNCTIONS.with(f)
}

/// Where a JSON value sits in an AppService, for key escaping: property names of
/// structured fields are escaped like the API server does (`__namespace__`,
/// `__dot__`...), keys of metadata and of maps (labels, annotations, resource lists,
/// managed fields' field sets) are not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Position {
    Root,
    Metadata,
    ManagedFields,
    Spec,
    Resources,
    Other,
    /// A map's keys: not escaped; its values are `Other`.
    Map,
    /// A free-form subtree (`fieldsV1`): nothing escaped.
    FreeForm,
}

impl Position {
    fn child(self, key: &str) -> Position {
        match (self, key) {
            (Position::Root, "metadata") => Position::Metadata,
            (Position::Root, "spec") => Position::Spec,
            (Position::Metadata, "labels" | "annotations") => Position::Map,
            (Position::Metadata, "managedFields") => Position::ManagedFields,
            (Position::ManagedFields, "fieldsV1") => Position::FreeForm,
            (Position::Spec, "resources") => Position::Resources,
            (Position::Resources, "limits" | "requests") => Position::Map,
            (Position::FreeForm, _) => Position::FreeForm,
            (Position::Map, _) => Position::Other,
            _ => Position::Other,
        }
    }

    /// Whether keys of a map at this position are escaped. Metadata's are not: the API
    /// server exposes `object.metadata.namespace` as is (checked in cel_conformance.rs).
    fn escapes(self) -> bool {
        !matches!(
            self,
            Position::Map | Position::FreeForm | Position::Metadata
        )
    }
}

/// Escapes a property name as Kubernetes' CEL does.
fn escape(name: &str) -> String {
    const RESERVED: [&str; 21] = [
        "true",
        "false",
        "null",
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    ];
    if RESERVED.contains(&name) {
        return format!("__{name}__");
    }
    if !name.contains(['_', '.', '-', '/']) {
        return name.to_owned();
    }
    let mut escaped = String::with_capacity(name.len() + 8);
    for ch in name.chars() {
        match ch {
            '_' => escaped.push_str("__"),
            '.' => escaped.push_str("__dot__"),
            '-' => escaped.push_str("__dash__"),
            '/' => escaped.push_str("__slash__"),
            _ => escaped.push(ch),
        }
    }
    escaped
}

/// Converts an AppService's raw JSON into a CEL value, only the projected parts, in one
/// pass and without an intermediate generic JSON value. More than `max_values` values
/// converted is an error, which bounds the memory of the CEL copy.
pub fn object_to_cel(
    raw: &RawValue,
    projection: &Projection,
    max_values: usize,
) -> Result<Value, ExpressionError> {
    let mut de = serde_json::Deserializer::from_str(raw.get());
    let remaining = std::cell::Cell::new(max_values);
    let value = CelSeed {
        projection: Some(projection),
        position: Position::Root,
        remaining: &remaining,
    }
    .deserialize(&mut de)
    .map_err(|e| {
        if remaining.get() == 0 {
            ExpressionError::TooManyValues { max: max_values }
        } else {
            ExpressionError::Json(e)
        }
    })?;
    Ok(value)
}

/// Converts any JSON (the namespace object) into a CEL value, keys unescaped.
pub fn json_to_cel(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => number(n.as_i64(), n.as_u64(), n.as_f64()),
        serde_json::Value::String(s) => Value::String(Arc::new(s.clone())),
        serde_json::Value::Array(items) => {
            Value::List(Arc::new(items.iter().map(json_to_cel).collect()))
        }
        serde_json::Value::Object(map) => Value::Map(Map {
            map: Arc::new(
                map.iter()
                    .map(|(k, v)| (Key::String(Arc::new(k.clone())), json_to_cel(v)))
                    .collect(),
            ),
        }),
    }
}

fn number(i: Option<i64>, u: Option<u64>, f: Option<f64>) -> Value {
    match (i, u, f) {
        (Some(i), _, _) => Value::Int(i),
        (None, Some(u), _) => Value::UInt(u),
        (None, None, f) => Value::Float(f.unwrap_or(f64::NAN)),
    }
}

struct CelSeed<'p> {
    /// `None`: take everything below.
    projection: Option<&'p Projection>,
    position: Position,
    /// Values that may still be converted.
    remaining: &'p std::cell::Cell<usize>,
}

impl<'de> DeserializeSeed<'de> for CelSeed<'_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        match self.remaining.get().checked_sub(1) {
            Some(left) => self.remaining.set(left),
            None => return Err(de::Error::custom("too many values")),
        }
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CelSeed<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(i64::try_from(v).map_or(Value::UInt(v), Value::Int))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(Arc::new(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(Arc::new(v)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        // A list is read whole (its elements are read through an index or a macro); its
        // elements sit where the list does (managed-field entries under managedFields).
        let element = self.position;
        while let Some(item) = seq.next_element_seed(CelSeed {
            projection: None,
            position: element,
            remaining: self.remaining,
        })? {
            items.push(item);
        }
        Ok(Value::List(Arc::new(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = std::collections::HashMap::new();
        while let Some(key) = access.next_key::<std::borrow::Cow<'de, str>>()? {
            let position = self.position.child(&key);
            let name = if self.position.escapes() {
                escape(&key)
            } else {
                key.into_owned()
            };
            let child = match self.projection {
                None => Some(None),
                Some(projection) => projection.child(&name).map(|p| (!p.whole).then_some(p)),
            };
            let Some(projection) = child else {
                access.next_value::<de::IgnoredAny>()?;
                continue;
            };
            let value = access.next_value_seed(CelSeed {
                projection,
                position,
                remaining: self.remaining,
            })?;
            map.insert(Key::String(Arc::new(name)), value);
        }
        Ok(Value::Map(Map { map: Arc::new(map) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VARS: [&str; 3] = ["object", "oldObject", "request"];

    #[test]
    fn macros_bind_and_namespaces_are_not_variables() {
        for source in [
            "[1,2,3].all(x, x > 0)",
            "object.spec.env.exists(e, e.name == 'A')",
            "object.spec.env.exists_one(e, e.name == 'A')",
            "object.spec.env.map(e, e.name).filter(n, n.startsWith('A')).size() >= 0",
            "sets.contains([1,2],[1])",
            "math.abs(-1) == 1",
            "strings.quote('a') != ''",
            "base64.encode(b'a') == 'YQ=='",
            "cel.bind(x, object.spec.replicas, x + x) >= 0",
        ] {
            let compiled = Expression::compile(source, &VARS);
            assert!(compiled.is_ok(), "{source}: {compiled:?}");
        }
        let err = Expression::compile("objet.spec > 1 && [1].all(x, y > 0)", &VARS).unwrap_err();
        assert_eq!(
            err.to_string(),
            "undeclared reference to objet, y (available: object, oldObject, request)"
        );
        // A comprehension variable is only bound inside its macro.
        assert!(Expression::compile("[1].all(x, x > 0) && x > 0", &VARS).is_err());
    }

    #[test]
    fn unary_runs_are_refused() {
        for source in [
            "!!true",
            "! !true",
            "!!!!true",
            "--1 == 1",
            "1 + --1 == 2",
            "x == - -1",
        ] {
            let err = Expression::compile(source, &["x"]).unwrap_err();
            assert!(
                matches!(err, ExpressionError::UnaryRun { .. }),
                "{source}: {err}"
            );
        }
        for source in [
            "!true == false",
            "1 - -1 == 2",
            "1--1 == 2",
            "!(!true)",
            "-(-1) == 1",
            "'!!' == '!!'",
            "\"--\" != ''",
            "r'\\!!' != ''",
            "1 != 2",
        ] {
            assert!(Expression::compile(source, &["x"]).is_ok(), "{source}");
        }
    }

    fn eval(source: &str, object: &str) -> Value {
        let expression = Expression::compile(source, &VARS).unwrap();
        let raw = RawValue::from_string(object.to_owned()).unwrap();
        let object = object_to_cel(&raw, &expression.object, 1000).unwrap();
        with_functions(|base| {
            let mut ctx = base.new_inner_scope();
            ctx.add_variable_from_value("object", object);
            expression.evaluate(&ctx).unwrap()
        })
    }

    #[test]
    fn evaluates_like_the_api_server() {
        let object = r#"{"metadata":{"name":"a","namespace":"n","labels":{"app.kubernetes.io/name":"a"},
            "managedFields":[{"fieldsV1":{"f:spec":{}}}]},
            "spec":{"replicas":3,"env":[{"name":"A"},{"name":"B"}]}}"#;
        for (source, expected) in [
            ("cel.bind(r, object.spec.replicas, r * 2) == 6", true),
            ("object.spec.env.all(e, !e.name.startsWith('AWS_'))", true),
            ("object.spec.env.exists_one(e, e.name == 'A')", true),
            ("object.spec.env.map(e, e.name) == ['A', 'B']", true),
            (
                "object.metadata.labels['app.kubernetes.io/name'] == 'a'",
                true,
            ),
            ("object.metadata.namespace == 'n'", true),
            ("!(!true)", true),
            ("-(-1) == 1", true),
            ("sets.contains([1,2],[1])", true),
        ] {
            assert_eq!(eval(source, object), Value::Bool(expected), "{source}");
        }
    }

    #[test]
    fn only_the_read_fields_are_converted() {
        let expression = Expression::compile("object.spec.replicas > 1", &VARS).unwrap();
        let raw = RawValue::from_string(
            r#"{"metadata":{"name":"a"},"spec":{"replicas":2,"env":[]}}"#.to_owned(),
        )
        .unwrap();
        let Value::Map(root) = object_to_cel(&raw, &expression.object, 1000).unwrap() else {
            panic!("not a map");
        };
        assert_eq!(root.map.len(), 1);
        let Some(Value::Map(spec)) = root.map.get(&Key::String(Arc::new("spec".into()))) else {
            panic!("no spec");
        };
        assert_eq!(spec.map.len(), 1);
        // Only converted values count against the bound: root, spec, replicas.
        assert!(object_to_cel(&raw, &expression.object, 3).is_ok());
        let err = object_to_cel(&raw, &expression.object, 2).unwrap_err();
        assert!(err.to_string().contains("more than 2 JSON values"), "{err}");
    }

    #[test]
    fn cost_is_estimated_from_list_bounds() {
        let env = Expression::compile(
            "object.spec.env.all(a, object.spec.env.all(b, a.name != b.name || a == b))",
            &VARS,
        )
        .unwrap();
        assert!(env.cost < PER_EXPRESSION_COST_LIMIT, "{}", env.cost);
        let unbounded = Expression::compile(
            "object.metadata.managedFields.all(a, object.metadata.managedFields.all(b, object.metadata.managedFields.all(c, a != b)))",
            &VARS,
        )
        .unwrap();
        assert!(
            unbounded.cost > PER_EXPRESSION_COST_LIMIT,
            "{}",
            unbounded.cost
        );
    }
}
