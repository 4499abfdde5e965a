//! Benchmarks: synthetic training throughput (`bench`) and the input pipeline alone
//! (`bench-data`).

pub mod config;
pub mod data;
pub mod report;
pub mod training;
