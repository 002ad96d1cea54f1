//! Field errors in Kubernetes' format (`spec.port: Invalid value: 70000: must be between
//! 1 and 65535`), as `k8s.io/apimachinery/pkg/util/validation/field` reports them.

use std::fmt;

/// Longest value quoted back in an error message; longer ones are shortened.
const MAX_QUOTED_VALUE: usize = 128;

/// Legal but risky input, reported to the client as admission warnings.
pub type Warnings = Vec<String>;

/// The kind of a field error, as Kubernetes' `field.ErrorType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorType {
    Required,
    Invalid,
    Duplicate,
    Forbidden,
    TooLong,
    TooMany,
}

impl ErrorType {
    /// The `StatusCause` reason Kubernetes uses for this kind of error.
    pub fn reason(self) -> &'static str {
        match self {
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::Duplicate => "FieldValueDuplicate",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::TooMany => "FieldValueTooMany",
        }
    }
}

/// One problem with one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the field, e.g. `spec.env[2].name`.
    pub field: String,
    pub error_type: ErrorType,
    /// The offending value, already formatted as Kubernetes quotes it (strings in quotes).
    pub value: Option<String>,
    /// What is wrong, for a human.
    pub detail: String,
}

impl FieldError {
    pub(crate) fn new(
        field: impl Into<String>,
        error_type: ErrorType,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            field: field.into(),
            error_type,
            value: None,
            detail: detail.into(),
        }
    }

    pub(crate) fn with_value(mut self, value: impl Into<String>) -> Self {
        self.value = Some(value.into());
        self
    }

    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(field, ErrorType::Required, detail)
    }

    pub fn invalid_str(field: impl Into<String>, value: &str, detail: impl Into<String>) -> Self {
        Self::new(field, ErrorType::Invalid, detail).with_value(quote(value))
    }

    pub fn invalid_int(field: impl Into<String>, value: i64, detail: impl Into<String>) -> Self {
        Self::new(field, ErrorType::Invalid, detail).with_value(value.to_string())
    }

    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(field, ErrorType::Forbidden, detail)
    }

    pub fn duplicate(field: impl Into<String>, value: &str) -> Self {
        Self::new(field, ErrorType::Duplicate, "").with_value(quote(value))
    }

    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        Self::new(
            field,
            ErrorType::TooLong,
            format!("may not be more than {max} bytes"),
        )
    }

    pub fn too_many(field: impl Into<String>, actual: usize, max: usize) -> Self {
        Self::new(
            field,
            ErrorType::TooMany,
            format!("must have at most {max} items"),
        )
        .with_value(actual.to_string())
    }
}

impl FieldError {
    /// The message without the field path (`Invalid value: 70000: must be between 1 and
    /// 65535`), as a `StatusCause` carries it next to its `field`.
    pub fn body(&self) -> String {
        let label = match self.error_type {
            ErrorType::Required => "Required value",
            ErrorType::Invalid => "Invalid value",
            ErrorType::Duplicate => "Duplicate value",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::TooLong => "Too long",
            ErrorType::TooMany => "Too many",
        };
        let mut body = label.to_owned();
        for part in [
            self.value.as_deref(),
            Some(self.detail.as_str()).filter(|d| !d.is_empty()),
        ]
        .into_iter()
        .flatten()
        {
            body.push_str(": ");
            body.push_str(part);
        }
        body
    }
}

/// `<field>: <body>`, as Kubernetes prints a field error.
impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// Every field error of one object, in the order the fields appear.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldErrors(pub Vec<FieldError>);

impl FieldErrors {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &FieldError> {
        self.0.iter()
    }
}

/// Formats like Kubernetes' aggregate: one error alone, several as `[a, b]`.
impl fmt::Display for FieldErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [one] => write!(f, "{one}"),
            many => {
                let joined: Vec<String> = many.iter().map(ToString::to_string).collect();
                write!(f, "[{}]", joined.join(", "))
            }
        }
    }
}

impl std::error::Error for FieldErrors {}

/// Quotes a string the way Go's `%q` does for printable input, shortening long values.
fn quote(value: &str) -> String {
    if value.len() <= MAX_QUOTED_VALUE {
        return format!("{value:?}");
    }
    let mut end = MAX_QUOTED_VALUE;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}...(truncated, {} bytes)", &value[..end], value.len())
}
