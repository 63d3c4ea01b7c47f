//! Embeds the web UI (`web/` at the top of the repository) in the proxy at compile time, so
//! that `cargo build --release` alone ships it and a debug binary (the tests) serves the bytes
//! it was built with, never whatever `web/` holds when it runs.
//!
//! For each file it writes `$OUT_DIR/web_assets.rs`: a table of `Asset`s with the bytes
//! (`include_bytes!`), a gzip copy made here once (kept only when smaller), and a strong ETag
//! (SHA-256 of the bytes). Every file and every directory is named in `rerun-if-changed`: a
//! changed file reruns this script by its own mtime, an added or removed one by its
//! directory's. Left out: what only builds or checks the assets (`node_modules/`,
//! `package.json`, `package-lock.json`, `check-vendor.sh`, `vendor/FILES`) and dotfiles.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

const SKIP: &[&str] = &[
    "node_modules",
    "package.json",
    "package-lock.json",
    "check-vendor.sh",
    "vendor/FILES",
];

fn main() {
    if let Err(e) = run() {
        println!("cargo::error=embedding web/: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let web = manifest
        .parent()
        .ok_or("the proxy crate has no parent directory")?
        .join("web");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut files = Vec::new();
    walk(&web, &web, &mut files)?;
    files.sort();

    let mut table = String::from("pub static ASSETS: &[Asset] = &[\n");
    for (i, rel) in files.iter().enumerate() {
        let path = web.join(rel);
        let bytes = std::fs::read(&path)?;
        let digest = <sha2::Sha256 as sha2::Digest>::digest(&bytes);
        let etag: String = digest[..16].iter().fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        });
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&bytes)?;
        let gz = gz.finish()?;
        let gzip = if gz.len() + 64 < bytes.len() {
            let name = format!("asset-{i}.gz");
            std::fs::write(out.join(&name), &gz)?;
            format!("Some(include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{name}\")))")
        } else {
            "None".to_string()
        };
        writeln!(
            table,
            "    Asset {{ path: {rel:?}, body: include_bytes!({path:?}), gzip: {gzip}, etag: {etag:?} }},",
            rel = rel.replace('\\', "/"),
            path = path.display().to_string(),
        )?;
    }
    table.push_str("];\n");
    std::fs::write(out.join("web_assets.rs"), table)?;
    Ok(())
}

/// Every file under `dir`, relative to `root`; names each directory and file for cargo.
fn walk(
    root: &Path,
    dir: &Path,
    files: &mut Vec<String>,
) -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo::rerun-if-changed={}", dir.display());
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let rel = path
            .strip_prefix(root)?
            .to_str()
            .ok_or_else(|| format!("{} is not UTF-8", path.display()))?
            .replace('\\', "/");
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') || SKIP.contains(&rel.as_str()) {
            continue;
        }
        if entry.file_type()?.is_dir() {
            walk(root, &path, files)?;
        } else {
            println!("cargo::rerun-if-changed={}", path.display());
            files.push(rel);
        }
    }
    Ok(())
}
