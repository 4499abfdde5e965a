//! A trained checkpoint put to use: restored for prediction, evaluated on a data set, and the
//! `eval` / `predict` requests on the asked (or the checkpoint's) GPU or the CPU.

pub mod evaluate;
pub mod predict;
pub mod requests;
