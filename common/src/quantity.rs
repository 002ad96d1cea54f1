//! Kubernetes quantities (`100m`, `1Gi`, `2e3`) read by value, within the bound the API
//! server itself keeps.
//!
//! `kube_quantity` compares two quantities by rescaling one to the other's unit in a
//! 96-bit decimal, which overflows (and panics) for values far beyond anything a
//! container can request. Kubernetes caps every quantity at 2^63-1 base units, so a
//! larger one is refused here, and only quantities within that bound are ever compared:
//! rescaling those fits the decimal with room to spare.

use std::cmp::Ordering;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube_quantity::ParsedQuantity;

/// The largest magnitude of a quantity, in base units (cores, bytes): Kubernetes'
/// own cap (`resource.Quantity` holds no number above 2^63-1).
pub const MAX_QUANTITY: f64 = i64::MAX as f64;

/// Why a quantity is not one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")]
    Syntax,
    #[error("must be at most 2^63-1 (9223372036854775807) in magnitude")]
    TooLarge,
}

/// A quantity known to be within [`MAX_QUANTITY`], so comparing it cannot overflow.
#[derive(Debug, Clone)]
pub struct Amount(ParsedQuantity);

impl Amount {
    /// Parses `q`, refusing a magnitude beyond [`MAX_QUANTITY`].
    pub fn parse(q: &Quantity) -> Result<Self, QuantityError> {
        let parsed = ParsedQuantity::try_from(q).map_err(|_| QuantityError::Syntax)?;
        // The float conversion cannot overflow or panic; it only decides the bound.
        match parsed.to_bytes_f64() {
            Some(v) if v.is_finite() && v.abs() <= MAX_QUANTITY => Ok(Amount(parsed)),
            _ => Err(QuantityError::TooLarge),
        }
    }

    /// Whether the amount is below zero.
    pub fn is_negative(&self) -> bool {
        self.0 < ParsedQuantity::default()
    }
}

impl PartialEq for Amount {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl PartialOrd for Amount {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.0.cmp(&other.0))
    }
}

/// Whether two quantities say the same amount (`1000m` and `1`): equal text, or both
/// within bounds and equal by value.
pub fn same(a: &Quantity, b: &Quantity) -> bool {
    a.0 == b.0 || matches!((Amount::parse(a), Amount::parse(b)), (Ok(a), Ok(b)) if a == b)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_owned())
    }

    #[test]
    fn values_compare_across_units() {
        assert!(same(&q("1000m"), &q("1")));
        assert!(same(&q("1Ki"), &q("1024")));
        assert!(!same(&q("1k"), &q("1Ki")));
        assert!(Amount::parse(&q("1Gi")).unwrap() > Amount::parse(&q("1G")).unwrap());
        assert!(Amount::parse(&q("-1")).unwrap().is_negative());
        assert!(!Amount::parse(&q("0")).unwrap().is_negative());
    }

    #[test]
    fn the_bound_is_kubernetes_own() {
        assert!(Amount::parse(&q("9223372036854775807")).is_ok());
        assert!(Amount::parse(&q("9000P")).is_ok());
        assert_eq!(
            Amount::parse(&q("10000P")).unwrap_err(),
            QuantityError::TooLarge
        );
        assert_eq!(
            Amount::parse(&q("-99999999999999999999")).unwrap_err(),
            QuantityError::TooLarge
        );
        assert_eq!(
            Amount::parse(&q("lots")).unwrap_err(),
            QuantityError::Syntax
        );
    }

    /// Found by `validation_never_panics`: rescaling a huge mantissa to a small unit
    /// overflowed inside `kube_quantity` and panicked.
    #[test]
    fn huge_values_against_small_units_do_not_panic() {
        let huge = q("999999999999999999999999999999.9");
        for small in ["1m", "1n", "1u", "1"] {
            assert!(!same(&huge, &q(small)));
        }
        assert!(Amount::parse(&huge).is_err());
        // Within the bound, the extreme rescaling (peta to nano; `kube_quantity` reads
        // no exa suffix) still fits.
        let big = Amount::parse(&q("9000P")).unwrap();
        assert!(big > Amount::parse(&q("1n")).unwrap());
        assert!(Amount::parse(&q("8191Pi")).unwrap() > Amount::parse(&q("1n")).unwrap());
    }
}
