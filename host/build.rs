//! Builds the components the `pooler` binary embeds (one per role) for wasm32-wasip2 and
//! writes `$OUT_DIR/embedded.rs`, so `cargo build` / `cargo run` need no manual step and the
//! binary runs with no extra files.

#[path = "guest_build.rs"]
mod guest_build;

use guest_build::{Guest, build_guests, literal};
use std::path::PathBuf;

/// The embedded default component of each role: (role, package in this workspace).
/// Adding a plugin is one line here, e.g. `("account-pool", "account-pool"),`. A role not
/// listed has no embedded component: it is empty unless the configuration names a file.
const EMBEDDED: &[(&str, &str)] = &[
    ("account-pool", "account-pool"),
    ("provider-retry", "provider-retry"),
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=guest_build.rs");
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir
        .parent()
        .expect("the host lives in the workspace")
        .to_path_buf();
    let guests: Vec<Guest<'_>> = EMBEDDED
        .iter()
        .map(|(_, package)| Guest {
            package,
            dir: root.join("plugins").join(package),
        })
        .collect();
    let watch = [root.join("wit"), root.join("plugins").join("kit")];
    let paths = build_guests("embedded", &root.join("Cargo.toml"), &guests, &watch);

    let mut code = String::from(
        "/// The embedded default components: (role, component bytes).\n\
         pub const EMBEDDED: &[(&str, &[u8])] = &[\n",
    );
    for ((role, _), path) in EMBEDDED.iter().zip(&paths) {
        code.push_str(&format!(
            "    ({role:?}, include_bytes!({})),\n",
            literal(path)
        ));
    }
    code.push_str("];\n");
    code.push_str(&wit_files(&root.join("wit")));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo")).join("embedded.rs");
    std::fs::write(&out, code).expect("write embedded.rs");
}

/// `EMBEDDED_WIT`: every file under `wit/` (the package, its `deps/`, `CHANGES.md`) as the
/// components were built against it, so `pooler components export` hands out that exact
/// contract. Paths are relative to `wit/`, with `/`, sorted.
fn wit_files(wit: &std::path::Path) -> String {
    fn walk(dir: &std::path::Path, files: &mut Vec<PathBuf>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, files);
            } else {
                files.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(wit, &mut files);
    files.sort();
    let mut code = String::from(
        "/// The WIT package the components were built against: (path under `wit/`, bytes).\n\
         pub const EMBEDDED_WIT: &[(&str, &[u8])] = &[\n",
    );
    for path in &files {
        let relative = path.strip_prefix(wit).expect("under wit/");
        let name: Vec<String> = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        code.push_str(&format!(
            "    ({:?}, include_bytes!({})),\n",
            name.join("/"),
            literal(path)
        ));
    }
    code.push_str("];\n");
    code
}
