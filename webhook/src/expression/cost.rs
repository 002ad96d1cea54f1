//! The worst-case cost estimate of an expression: 1 per node, comprehension bodies times
//! the bound of the list they range over (`common::types::LIST_BOUNDS`).

use kube::core::cel::cel::common::ast::{EntryExpr, Expr, IdedExpr};

use super::select_chain;
use crate::review::MAX_POLICY_VALUES;

/// The largest number of elements `expr` can have when it is a list or map.
pub(super) fn max_len(expr: &IdedExpr) -> u64 {
    let limit = MAX_POLICY_VALUES as u64;
    match &expr.expr {
        Expr::List(list) => list.elements.len() as u64,
        Expr::Map(map) => map.entries.len() as u64,
        Expr::Select(_) => match select_chain(expr) {
            Some(("object" | "oldObject", path)) => {
                let path: Vec<&str> = path.iter().map(String::as_str).collect();
                common::types::list_bound(&path.join(".")).map_or(limit, |max| max as u64)
            }
            _ => limit,
        },
        // map() and filter() yield at most as many elements as they iterate.
        Expr::Comprehension(c) => max_len(&c.iter_range),
        _ => limit,
    }
}

/// Worst-case cost: 1 per node, comprehension bodies times their range's size.
pub(super) fn estimate(expr: &IdedExpr) -> u64 {
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
