//! CPU quantizers (in progress).
