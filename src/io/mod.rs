//! File input and output with the guarantees `docs/reliability.md` states:
//! outputs are replaced atomically and only if they are regular files, inputs
//! are read only from regular files and only up to a stated size.

pub mod atomic_write;
pub mod bounded_read;
pub mod escape;
pub mod host_memory;

pub use atomic_write::{check_output_path, write_atomic};
pub use bounded_read::{open_regular, read_regular, read_safetensors};
pub use escape::escaped;
pub use host_memory::{available_bytes, ensure_fits};
