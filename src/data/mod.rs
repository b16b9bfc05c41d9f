//! Data (in progress).
