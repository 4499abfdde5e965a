//! Optimizers whose step is one device operation on burn-cuda (as Burn keeps its optimizers
//! apart from its modules).

pub mod adamw;
pub(crate) mod adamw_rule;
pub(crate) mod params;
pub mod sgd;
pub(crate) mod sgd_rule;
#[cfg(test)]
mod test_net;
