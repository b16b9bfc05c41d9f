//! Library side of the fp8 tool (in progress).
