//! `cel.bind`, which the interpreter here lacks, rewritten as CEL-Go expands it.

use kube::core::cel::cel::common::ast::{EntryExpr, Expr, IdedExpr};

use super::{ExpressionError, parse};

/// Rewrites every `cel.bind(name, init, body)` into a comprehension over an empty list
/// whose accumulator is `name`, as CEL-Go expands the macro.
pub(super) fn rewrite_bind(expr: &mut IdedExpr) -> Result<(), ExpressionError> {
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
