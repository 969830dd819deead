//! The component's linear memory starts at 4 MiB (the linker's default is ~1.1 MiB): an
//! agent's request body of a few hundred KiB is buffered whole, and growing the memory to
//! hold it cost a host `mprotect` per step on every request. Pages are only committed when
//! touched, so a small request costs no more.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo:rustc-link-arg-cdylib=--initial-memory=4194304");
    }
}
