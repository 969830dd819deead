//! The plugin roles the host fills and the world each role's component must fit. Before a
//! component is instantiated its `pooler:plugins` imports and exports are compared with the
//! role's world (`wit/worlds.wit`); standard WASI imports, which the host provides, are
//! accepted. A mismatch is refused with a message that names the plugin, the expected world
//! and what was found. (Function signatures are then type-checked by wasmtime when the
//! component is pre-instantiated against the linker and the generated bindings.)

use std::fmt;

use wasmtime::Engine;
use wasmtime::component::Component;

/// The WIT package every plugin is written against.
pub const PACKAGE: &str = "pooler:plugins";
/// The contract's version; a plugin built against any 0.1.x fits.
pub const VERSION: &str = "0.1.0";

/// A role the host fills with one plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// The account pool: the HTTP proxy; answers availability.
    AccountPool,
    /// Provider Retry: durable retries; listens for availability changes.
    ProviderRetry,
}

/// What a role's world says about the interfaces of this package (and the non-`pooler`
/// exports it requires).
struct WorldShape {
    world: &'static str,
    /// `pooler:plugins` interfaces the component must export.
    exports: &'static [&'static str],
    /// Other exports it must have (by name without version).
    foreign_exports: &'static [&'static str],
    /// `pooler:plugins` interfaces it may import.
    imports: &'static [&'static str],
}

// Mirrors `wit/worlds.wit`. `types` carries only types and may appear on either side.
const ACCOUNT_POOL: WorldShape = WorldShape {
    world: "account-pool",
    exports: &[
        "availability",
        "routing",
        "accounts",
        "maintenance",
        "settings",
        "tokens",
    ],
    foreign_exports: &["wasi:http/incoming-handler"],
    imports: &[
        "types",
        "sqlite",
        "log",
        "availability-listener",
        "incoming-client",
        "metrics",
    ],
};

const PROVIDER_RETRY: WorldShape = WorldShape {
    world: "provider-retry",
    exports: &[
        "availability-listener",
        "turn-events",
        "scheduler",
        "retry-admin",
        "settings",
    ],
    foreign_exports: &[],
    imports: &[
        "types",
        "sqlite",
        "log",
        "availability",
        "threads",
        "metrics",
    ],
};

impl Role {
    /// Every role, the pool first.
    pub const ALL: [Role; 2] = [Role::AccountPool, Role::ProviderRetry];

    /// The role's name in configuration, data directories and messages; also the plugin id.
    pub fn name(self) -> &'static str {
        match self {
            Role::AccountPool => "account-pool",
            Role::ProviderRetry => "provider-retry",
        }
    }

    /// The role named `name` (`account-pool`, `provider-retry`); None for any other name.
    pub fn from_name(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| role.name() == name)
    }

    fn shape(self) -> &'static WorldShape {
        match self {
            Role::AccountPool => &ACCOUNT_POOL,
            Role::ProviderRetry => &PROVIDER_RETRY,
        }
    }

    /// The fully qualified world name (`pooler:plugins/account-pool@0.1.0`).
    pub fn world(self) -> String {
        format!("{PACKAGE}/{}@{VERSION}", self.shape().world)
    }

    /// Whether a plugin in this role exports `availability-listener` (gets availability
    /// changes delivered).
    pub fn is_listener(self) -> bool {
        self.shape().exports.contains(&"availability-listener")
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A component's imports and exports, by name.
#[derive(Debug, Clone, Default)]
pub struct Surface {
    /// The component's imports, by their full names (`pooler:plugins/sqlite@0.1.0`).
    pub imports: Vec<String>,
    /// The component's exports, by their full names.
    pub exports: Vec<String>,
}

impl Surface {
    /// The imports and exports of `component`, as compiled for `engine`.
    pub fn of(component: &Component, engine: &Engine) -> Surface {
        let ty = component.component_type();
        Surface {
            imports: ty
                .imports(engine)
                .map(|(name, _)| name.to_string())
                .collect(),
            exports: ty
                .exports(engine)
                .map(|(name, _)| name.to_string())
                .collect(),
        }
    }
}

/// Why a component does not fit its role.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "plugin `{plugin}` does not fit its role: expected world {expected}; found {found}: {problems}"
)]
pub struct WorldMismatch {
    /// The plugin's id.
    pub plugin: String,
    /// The expected world and what it exports and may import.
    pub expected: String,
    /// What the component is: the world it fits, if any, and its exports and imports.
    pub found: String,
    /// What does not fit.
    pub problems: String,
}

/// A `pooler:plugins` interface name of this contract version, without package and version.
fn own_interface(name: &str) -> Option<&str> {
    let rest = name.strip_prefix(PACKAGE)?.strip_prefix('/')?;
    let (iface, version) = rest.split_once('@')?;
    // 0.x versions are compatible within a minor version.
    version.starts_with("0.1.").then_some(iface)
}

fn unversioned(name: &str) -> &str {
    name.split_once('@').map_or(name, |(n, _)| n)
}

/// The reasons `surface` does not fit `role` (empty when it fits).
fn misfits(role: Role, surface: &Surface) -> Vec<String> {
    let shape = role.shape();
    let mut problems = Vec::new();
    let missing: Vec<&str> = shape
        .exports
        .iter()
        .copied()
        .filter(|want| {
            !surface
                .exports
                .iter()
                .any(|e| own_interface(e) == Some(want))
        })
        .chain(
            shape
                .foreign_exports
                .iter()
                .copied()
                .filter(|want| !surface.exports.iter().any(|e| unversioned(e) == *want)),
        )
        .collect();
    if !missing.is_empty() {
        problems.push(format!("missing exports [{}]", missing.join(", ")));
    }
    let unexpected: Vec<&str> = surface
        .imports
        .iter()
        .map(String::as_str)
        .filter(|name| match own_interface(name) {
            Some(iface) => !shape.imports.contains(&iface),
            // The host provides WASI 0.2; anything else it cannot satisfy.
            None => !name.starts_with("wasi:"),
        })
        .collect();
    if !unexpected.is_empty() {
        problems.push(format!("unexpected imports [{}]", unexpected.join(", ")));
    }
    problems
}

/// Check `surface` against `role`'s world.
pub fn check_world(plugin: &str, role: Role, surface: &Surface) -> Result<(), WorldMismatch> {
    let problems = misfits(role, surface);
    if problems.is_empty() {
        return Ok(());
    }
    let shape = role.shape();
    let short = |names: &[String]| {
        names
            .iter()
            .map(|n| own_interface(n).map_or_else(|| unversioned(n).to_string(), str::to_string))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let found_world = Role::ALL
        .into_iter()
        .find(|other| *other != role && misfits(*other, surface).is_empty())
        .map(|other| format!("a component of world {}, which ", other.world()))
        .unwrap_or_else(|| "a component that ".to_string());
    let expected_exports: Vec<&str> = shape
        .exports
        .iter()
        .chain(shape.foreign_exports)
        .copied()
        .collect();
    // WASI imports are the host's business, not the world's: count them only.
    let (wasi, own): (Vec<String>, Vec<String>) = surface
        .imports
        .iter()
        .cloned()
        .partition(|name| name.starts_with("wasi:"));
    let found_imports = match (own.is_empty(), wasi.len()) {
        (_, 0) => short(&own),
        (true, n) => format!("{n} WASI interfaces"),
        (false, n) => format!("{} and {n} WASI interfaces", short(&own)),
    };
    Err(WorldMismatch {
        plugin: plugin.to_string(),
        expected: format!(
            "{} (exports [{}]; may import [{}] and WASI 0.2)",
            role.world(),
            expected_exports.join(", "),
            shape.imports.join(", ")
        ),
        found: format!(
            "{found_world}exports [{}] and imports [{found_imports}]",
            short(&surface.exports)
        ),
        problems: problems.join("; "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn pool_surface() -> Surface {
        Surface {
            imports: names(&[
                "wasi:io/poll@0.2.12",
                "pooler:plugins/types@0.1.0",
                "pooler:plugins/sqlite@0.1.0",
                "pooler:plugins/availability-listener@0.1.0",
            ]),
            exports: names(&[
                "pooler:plugins/availability@0.1.0",
                "pooler:plugins/routing@0.1.0",
                "pooler:plugins/accounts@0.1.0",
                "pooler:plugins/maintenance@0.1.0",
                "pooler:plugins/settings@0.1.0",
                "pooler:plugins/tokens@0.1.0",
                "wasi:http/incoming-handler@0.2.4",
            ]),
        }
    }

    #[test]
    fn a_pool_fits_the_pool_role_and_not_the_retry_role() {
        check_world("p", Role::AccountPool, &pool_surface()).unwrap();
        let err = check_world("p", Role::ProviderRetry, &pool_surface()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("plugin `p`"), "{text}");
        assert!(
            text.contains("pooler:plugins/provider-retry@0.1.0"),
            "{text}"
        );
        assert!(
            text.contains("a component of world pooler:plugins/account-pool@0.1.0"),
            "{text}"
        );
        assert!(
            text.contains("missing exports [availability-listener, turn-events"),
            "{text}"
        );
        assert!(
            text.contains("unexpected imports [pooler:plugins/availability-listener@0.1.0]"),
            "{text}"
        );
    }

    /// `incoming-client` is the pool's to import or not: a pool that ignores its client's
    /// leaving (an older or simpler one) fits as well as one that listens. It is not
    /// Provider Retry's.
    #[test]
    fn a_pool_may_import_incoming_client_and_need_not() {
        let without = pool_surface();
        assert!(
            !without
                .imports
                .iter()
                .any(|i| i.contains("incoming-client"))
        );
        check_world("p", Role::AccountPool, &without).unwrap();
        let mut with = pool_surface();
        with.imports
            .push("pooler:plugins/incoming-client@0.1.0".into());
        check_world("p", Role::AccountPool, &with).unwrap();

        let retry = Surface {
            imports: names(&[
                "pooler:plugins/sqlite@0.1.0",
                "pooler:plugins/incoming-client@0.1.0",
            ]),
            exports: names(&[
                "pooler:plugins/availability-listener@0.1.0",
                "pooler:plugins/turn-events@0.1.0",
                "pooler:plugins/scheduler@0.1.0",
                "pooler:plugins/retry-admin@0.1.0",
                "pooler:plugins/settings@0.1.0",
            ]),
        };
        let err = check_world("r", Role::ProviderRetry, &retry).unwrap_err();
        assert!(
            err.to_string()
                .contains("unexpected imports [pooler:plugins/incoming-client@0.1.0]"),
            "{err}"
        );
    }

    /// `metrics` is optional for both roles: a plugin that reports nothing (an older one,
    /// or one written for another host) loads as well as one that reports.
    #[test]
    fn either_plugin_may_import_metrics_and_need_not() {
        let metrics = "pooler:plugins/metrics@0.1.0";
        let mut with = pool_surface();
        with.imports.push(metrics.into());
        check_world("p", Role::AccountPool, &with).unwrap();
        check_world("p", Role::AccountPool, &pool_surface()).unwrap();
        let exports = names(&[
            "pooler:plugins/availability-listener@0.1.0",
            "pooler:plugins/turn-events@0.1.0",
            "pooler:plugins/scheduler@0.1.0",
            "pooler:plugins/retry-admin@0.1.0",
            "pooler:plugins/settings@0.1.0",
        ]);
        for imports in [
            names(&["pooler:plugins/sqlite@0.1.0"]),
            names(&["pooler:plugins/sqlite@0.1.0", metrics]),
        ] {
            let retry = Surface {
                imports,
                exports: exports.clone(),
            };
            check_world("r", Role::ProviderRetry, &retry).unwrap();
        }
        // Still only this interface: a look-alike is refused.
        let mut other = pool_surface();
        other.imports.push("pooler:plugins/metric@0.1.0".into());
        assert!(check_world("p", Role::AccountPool, &other).is_err());
    }

    #[test]
    fn another_contract_version_does_not_fit() {
        let mut surface = pool_surface();
        surface.exports[0] = "pooler:plugins/availability@0.2.0".into();
        let err = check_world("p", Role::AccountPool, &surface).unwrap_err();
        assert!(
            err.to_string().contains("missing exports [availability]"),
            "{err}"
        );
    }

    #[test]
    fn imports_outside_wasi_and_the_world_are_refused() {
        let mut surface = pool_surface();
        surface.imports.push("acme:secret/keys@1.0.0".into());
        let err = check_world("p", Role::AccountPool, &surface).unwrap_err();
        assert!(err.to_string().contains("acme:secret/keys@1.0.0"), "{err}");
    }
}
