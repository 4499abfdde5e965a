//! Optimizers whose step is one device operation on burn-cuda (as Burn keeps its optimizers
//! apart from its modules).

pub mod adamw;
pub mod adamw_rule;
pub mod fused;
pub mod params;
pub mod sgd;
pub mod sgd_rule;
#[cfg(test)]
mod test_net;
