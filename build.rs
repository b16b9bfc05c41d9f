//! Build script. The CUDA kernels in `cuda/` are compiled here once the CUDA
//! foundation lands; until then the crate builds without kernels.
fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=cuda");
}
