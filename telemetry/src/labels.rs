//! Metric label values as enums: a label can only take the values its type lists, and
//! every series can be created at 0 from `ALL` before the first event.

#[doc(hidden)]
pub use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

/// Declares a label-value enum: its variants and how each is spelled in the metric, an
/// `as_str`, an `ALL` list of every value, and its `EncodeLabelValue`.
///
/// ```
/// telemetry::label_values! {
///     /// How a reconcile ended.
///     pub enum Result { Success => "success", Error => "error" }
/// }
/// assert_eq!(Result::ALL.len(), 2);
/// assert_eq!(Result::Error.as_str(), "error");
/// ```
#[macro_export]
macro_rules! label_values {
    ($(
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident => $value:literal),+ $(,)?
        }
    )+) => {$(
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
        $vis enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The value as the metric spells it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $value),+
                }
            }
        }

        impl $crate::labels::EncodeLabelValue for $name {
            fn encode(
                &self,
                encoder: &mut $crate::labels::LabelValueEncoder,
            ) -> ::std::result::Result<(), ::std::fmt::Error> {
                ::std::fmt::Write::write_str(encoder, self.as_str())
            }
        }
    )+};
}

label_values! {
    /// How an operation ended (the `result` label of a reconcile, a provider's step, a
    /// scan).
    pub enum Ended { Success => "success", Error => "error" }
}

impl Ended {
    pub fn of(ok: bool) -> Ended {
        if ok { Ended::Success } else { Ended::Error }
    }
}
