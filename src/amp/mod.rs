//! Automatic mixed precision: the dynamic loss scaler.

pub mod loss_scaler;
