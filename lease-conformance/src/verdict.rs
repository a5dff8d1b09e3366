//! The outcome of one property, and the helpers properties use to state it.

use std::fmt;

/// A property held, or did not apply to this backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every check passed.
    Passed,
    /// The backend lacks a capability or hook the property needs; the reason says which.
    NotApplicable(String),
}

/// A violated property: what was expected and what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<lease_core::Error> for Failure {
    fn from(e: lease_core::Error) -> Self {
        Failure(format!("unexpected error: {e}"))
    }
}

/// What every property returns.
pub type Verdict = Result<Outcome, Failure>;

/// Fails the property with a formatted message unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::Failure(format!($($msg)+)));
        }
    };
}
