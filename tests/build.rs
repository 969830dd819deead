//! Builds the test fixtures (guest components under `fixtures/`) for wasm32-wasip2 with the
//! same pipeline as the host's embedded components, and tells the tests where they are.

#[path = "../host/guest_build.rs"]
mod guest_build;

use guest_build::{Guest, build_guests, literal};
use std::path::PathBuf;

/// The fixtures: (const name in `support::fixtures`, package). One line per fixture.
const FIXTURES: &[(&str, &str)] = &[("POOL", "fixture-pool"), ("RETRY", "fixture-retry")];

/// The alternative Provider Retry of the swap scenario (PR-20): a separate guest workspace
/// under `fixtures/alt-retry`.
const ALT_RETRY: (&str, &str) = ("ALT_RETRY", "alt-retry");

/// The example alternative Provider Retry (`examples/alt-plugin`).
const EXAMPLE_PLUGIN: (&str, &str) = ("EXAMPLE_ALT_PLUGIN", "alt-plugin");

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=../host/guest_build.rs");
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let fixtures = manifest_dir.join("fixtures");
    let root = manifest_dir
        .parent()
        .expect("tests live in the workspace")
        .to_path_buf();
    let guests: Vec<Guest<'_>> = FIXTURES
        .iter()
        .map(|(_, package)| Guest {
            package,
            dir: fixtures.join(package.trim_start_matches("fixture-")),
        })
        .collect();
    let paths = build_guests(
        "fixtures",
        &fixtures.join("Cargo.toml"),
        &guests,
        &[root.join("wit")],
    );

    // The alternative Provider Retry (PR-20) is its own guest workspace, built the same way.
    let alt = Guest {
        package: ALT_RETRY.1,
        dir: fixtures.join("alt-retry"),
    };
    let alt_paths = build_guests(
        "alt-retry",
        &alt.dir.join("Cargo.toml"),
        std::slice::from_ref(&alt),
        &[root.join("wit")],
    );

    // The example plugin (`examples/alt-plugin`), a member of the main workspace: built in
    // the embedded components' guest directory, so it reuses the kit and wit-bindgen they
    // built.
    let example = Guest {
        package: EXAMPLE_PLUGIN.1,
        dir: root.join("examples").join("alt-plugin"),
    };
    let example_paths = build_guests(
        "embedded",
        &root.join("Cargo.toml"),
        std::slice::from_ref(&example),
        &[root.join("wit"), root.join("plugins").join("kit")],
    );

    let mut code = String::new();
    for ((name, package), path) in FIXTURES
        .iter()
        .chain(std::iter::once(&ALT_RETRY))
        .chain(std::iter::once(&EXAMPLE_PLUGIN))
        .zip(paths.iter().chain(&alt_paths).chain(&example_paths))
    {
        code.push_str(&format!(
            "/// The `{package}` component.\npub const {name}: &str = {};\n",
            literal(path)
        ));
    }
    // wasmtime's compile cache for the tests, shared by every run so only the first run
    // after a fixture change compiles it.
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    let target = out_dir
        .ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .map(PathBuf::from)
        .unwrap_or_else(|| out_dir.clone());
    code.push_str(&format!(
        "/// wasmtime's compile cache for tests.\npub const COMPILE_CACHE: &str = {};\n",
        literal(&target.join("wasmtime-cache"))
    ));
    std::fs::write(out_dir.join("fixtures.rs"), code).expect("write fixtures.rs");
}
