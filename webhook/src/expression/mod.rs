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
//! * **Values** ([`values`]): per review, only the projected fields of the object are
//!   converted to CEL values, straight from its JSON, in one pass; what replaces part
//!   of it (the hub form, a scale's replicas) is put in during that pass.
//! * **Cost.** A worst-case estimate in the spirit of the API server's estimator:
//!   every node costs 1, a comprehension costs its body times the largest size its
//!   list can have (`spec.env` at most 128 entries, any other list of an object at most
//!   [`crate::review::MAX_POLICY_VALUES`] values). A policy over the budget is refused.

use std::collections::{BTreeMap, BTreeSet};

use kube::core::cel::KubeCelExt;
use kube::core::cel::cel::common::ast::{EntryExpr, Expr, IdedExpr};
use kube::core::cel::cel::{Context, ExecutionError, Program, Value};

#[cfg(test)]
use crate::review::MAX_POLICY_VALUES;

mod bind;
mod cost;
mod lint;
mod values;

use bind::rewrite_bind;
use cost::estimate;
#[cfg(test)]
use cost::max_len;
use lint::unary_run;

pub use values::{Replace, With, json_to_cel, object_to_cel, value_to_cel};

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

/// The CEL context with the standard and Kubernetes function libraries, built once per
/// thread (registering them is the expensive part of a context).
pub fn with_functions<R>(f: impl FnOnce(&Context<'static>) -> R) -> R {
    thread_local! {
        static FUNCTIONS: Context<'static> = Context::default().with_all();
    }
    FUNCTIONS.with(f)
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
        let object = object_to_cel(object.as_bytes(), &expression.object, 1000, &[]).unwrap();
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

    /// The cost estimate takes each bounded list at its bound from the one table.
    #[test]
    fn every_list_bound_is_the_cost_estimates_bound() {
        for &(path, max) in common::types::LIST_BOUNDS {
            let ast = parse(&format!("object.{path}"))
                .unwrap()
                .expression()
                .clone();
            assert_eq!(max_len(&ast), max as u64, "{path}");
        }
        let unbounded = parse("object.metadata.managedFields")
            .unwrap()
            .expression()
            .clone();
        assert_eq!(max_len(&unbounded), MAX_POLICY_VALUES as u64);
    }

    #[test]
    fn a_comprehension_over_ports_is_costed_by_the_ports_bound() {
        let ports = Expression::compile("object.spec.ports.all(p, p.port > 1024)", &VARS).unwrap();
        let unbounded =
            Expression::compile("object.metadata.managedFields.all(p, p.port > 1024)", &VARS)
                .unwrap();
        // The same body over at most MAX_PORTS entries, not MAX_POLICY_VALUES.
        assert!(ports.cost < 16 * 20, "{}", ports.cost);
        assert!(
            unbounded.cost > 1000 * ports.cost / 16,
            "{} vs {}",
            unbounded.cost,
            ports.cost
        );
    }
}
