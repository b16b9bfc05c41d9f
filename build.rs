//! Build script: compiles every `cuda/*.cu` with nvcc into a fatbin (SASS for
//! each supported GPU generation plus PTX for future ones) that the crate
//! embeds. Without nvcc the crate builds without kernels (`cfg(fp8_no_kernels)`)
//! and says so once.
//!
//! nvcc is looked up in `NVCC`, then `CUDA_HOME`/`CUDA_PATH`, then `PATH`,
//! then `.cache/nvcc` (where `scripts/install-nvcc.sh` puts the PyPI build).
//! The `-Xptxas -v` report of each file is saved next to its fatbin
//! (`OUT_DIR/<name>.ptxas.txt`); a register spill is a warning, or an error
//! when `FP8_DENY_SPILLS=1` (CI).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// SASS targets (the `a` variants carry the architecture-specific features)
/// and the PTX of compute_120 that newer drivers can JIT.
const GENCODES: &[&str] = &[
    "-gencode=arch=compute_75,code=sm_75",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_86,code=sm_86",
    "-gencode=arch=compute_89,code=sm_89",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_100a,code=sm_100a",
    "-gencode=arch=compute_120,code=sm_120",
    "-gencode=arch=compute_120,code=compute_120",
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=cuda");
    for var in ["NVCC", "CUDA_HOME", "CUDA_PATH", "PATH", "FP8_DENY_SPILLS"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    println!("cargo::rustc-check-cfg=cfg(fp8_no_kernels)");

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let sources = cuda_sources(&manifest.join("cuda"));
    let deny_spills = env::var("FP8_DENY_SPILLS").is_ok_and(|v| v == "1");

    let fatbins = match find_nvcc(&manifest) {
        Some(nvcc) => compile_all(&nvcc, &manifest, &out, &sources, deny_spills),
        None => {
            println!(
                "cargo::warning=nvcc not found (NVCC, CUDA_HOME/CUDA_PATH, PATH, .cache/nvcc): \
                 building without CUDA kernels; run scripts/install-nvcc.sh to get one"
            );
            println!("cargo::rustc-cfg=fp8_no_kernels");
            Vec::new()
        }
    };
    write_registry(&out, &fatbins);
}

/// `cuda/*.cu`, sorted so the embedded order is stable.
fn cuda_sources(dir: &Path) -> Vec<PathBuf> {
    let mut sources: Vec<PathBuf> = fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "cu"))
                .collect()
        })
        .unwrap_or_default();
    sources.sort();
    sources
}

/// The first nvcc that exists, in the documented order.
fn find_nvcc(manifest: &Path) -> Option<PathBuf> {
    if let Some(nvcc) = env::var_os("NVCC") {
        return Some(PathBuf::from(nvcc));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = env::var_os(var) {
            let nvcc = PathBuf::from(home).join("bin").join("nvcc");
            if nvcc.is_file() {
                return Some(nvcc);
            }
        }
    }
    if let Some(path) = env::var_os("PATH") {
        for dir in env::split_paths(&path) {
            let nvcc = dir.join("nvcc");
            if nvcc.is_file() {
                return Some(nvcc);
            }
        }
    }
    let cached = manifest.join(".cache/nvcc/nvidia/cu13/bin/nvcc");
    cached.is_file().then_some(cached)
}

/// Compiles every source in parallel (one nvcc per file); returns `(name, fatbin path)`.
fn compile_all(
    nvcc: &Path,
    manifest: &Path,
    out: &Path,
    sources: &[PathBuf],
    deny_spills: bool,
) -> Vec<(String, PathBuf)> {
    let include = manifest.join("cuda/include");
    let results: Vec<(String, PathBuf, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = sources
            .iter()
            .map(|source| scope.spawn(|| compile_one(nvcc, &include, out, source)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panic!("nvcc thread panicked")))
            .collect()
    });
    let mut fatbins = Vec::new();
    for (name, fatbin, report) in results {
        let spills = spilling_functions(&report);
        if !spills.is_empty() {
            let message = format!("register spills in cuda/{name}.cu: {}", spills.join("; "));
            if deny_spills {
                panic!("{message} (FP8_DENY_SPILLS=1)");
            }
            println!("cargo::warning={message}");
        }
        fatbins.push((name, fatbin));
    }
    fatbins
}

/// One nvcc call for all targets of one file; the ptxas report goes to `<name>.ptxas.txt`.
fn compile_one(nvcc: &Path, include: &Path, out: &Path, source: &Path) -> (String, PathBuf, String) {
    let name = source
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_else(|| panic!("non-UTF-8 kernel file name {}", source.display()))
        .to_string();
    let fatbin = out.join(format!("{name}.fatbin"));
    let output = Command::new(nvcc)
        .args([
            "-fatbin",
            // ~4x smaller than nvcc's default compression (measured on cuda/norm.cu: 133 KB vs
            // 557 KB), so the GPU bundle's binaries, each embedding every fatbin, stay under its
            // 64 MiB; the driver (580+, which 13.0 fatbins need anyway) decompresses at load.
            "--compress-mode=size",
            "-O3",
            "-std=c++17",
            "-Xptxas",
            "-v",
            "-Werror",
            "all-warnings",
        ])
        .arg("-I")
        .arg(include)
        .args(GENCODES)
        .arg("-o")
        .arg(&fatbin)
        .arg(source)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", nvcc.display()));
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    fs::write(out.join(format!("{name}.ptxas.txt")), &report).expect("OUT_DIR is writable");
    if !output.status.success() {
        panic!("nvcc failed on {} ({}):\n{report}", source.display(), output.status);
    }
    (name, fatbin, report)
}

/// `function (arch): N bytes spill stores, M bytes spill loads` for every function with a non-zero spill.
fn spilling_functions(report: &str) -> Vec<String> {
    let mut current = String::new();
    let mut spills = Vec::new();
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            current = rest.replace("' for '", " (").trim_end_matches('\'').to_string() + ")";
        } else if line.contains("spill stores") {
            let numbers: Vec<u64> = line
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|w| w.parse().ok())
                .collect();
            // "S bytes stack frame, T bytes spill stores, L bytes spill loads"
            if numbers.len() >= 3 && (numbers[1] != 0 || numbers[2] != 0) {
                spills.push(format!("{current}: {}", line.trim()));
            }
        }
    }
    spills
}

/// `OUT_DIR/kernels.rs`: the embedded fatbins as `(module name, bytes)`.
fn write_registry(out: &Path, fatbins: &[(String, PathBuf)]) {
    let mut code = String::from("/// Compiled kernel modules: (file stem of `cuda/*.cu`, fatbin bytes).\n");
    code.push_str("pub static FATBINS: &[(&str, &[u8])] = &[\n");
    for (name, path) in fatbins {
        code.push_str(&format!(
            "    ({name:?}, include_bytes!({:?})),\n",
            path.display().to_string()
        ));
    }
    code.push_str("];\n");
    fs::write(out.join("kernels.rs"), code).expect("OUT_DIR is writable");
}
