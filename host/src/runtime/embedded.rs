//! The components built into the binary by `build.rs`, one per role that has a default.

use crate::runtime::roles::Role;

include!(concat!(env!("OUT_DIR"), "/embedded.rs"));

/// The embedded component of `role`, if the binary has one.
pub fn component(role: Role) -> Option<&'static [u8]> {
    EMBEDDED
        .iter()
        .find(|(name, _)| *name == role.name())
        .map(|(_, bytes)| *bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The WASI version of the contract (`wit/deps`, the README).
    const WASI: &str = "@0.2.12";

    /// Both embedded components import WASI at one version, the contract's: a host that
    /// matches versions exactly provides one WASI. (Rust's std declares its own WASI
    /// imports at an older 0.2; the components link a 0.2.12 description of them.)
    #[test]
    fn the_embedded_components_import_wasi_at_the_contracts_version_only() {
        let engine = crate::runtime::engine::build(crate::runtime::engine::EngineLimits {
            max_instances: 4,
            max_memory_bytes: 64 << 20,
        })
        .unwrap();
        for role in Role::ALL {
            let bytes = component(role).expect("an embedded component");
            let component = wasmtime::component::Component::new(&engine, bytes).unwrap();
            let imports: Vec<String> = component
                .component_type()
                .imports(&engine)
                .map(|(name, _)| name.to_owned())
                .collect();
            let wasi: Vec<&String> = imports.iter().filter(|n| n.starts_with("wasi:")).collect();
            assert!(wasi.len() >= 5, "{role}: {imports:?}");
            let other: Vec<&&String> = wasi.iter().filter(|n| !n.ends_with(WASI)).collect();
            assert!(
                other.is_empty(),
                "{role} imports WASI at another version: {other:?}"
            );
        }
    }
}
