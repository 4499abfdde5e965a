//! Optimizers whose step is one device operation on burn-cuda (as Burn keeps its optimizers
//! apart from its modules).

pub mod sgd;
pub(crate) mod sgd_rule;
