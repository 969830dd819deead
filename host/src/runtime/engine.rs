//! The one wasmtime `Engine` and its settings, each chosen for a reason written beside it,
//! the epoch ticker that lets the host stop a guest that runs past its deadline, and the
//! compile cache that makes a first start fast.
//!
//! # The compile cache
//!
//! Compiling the two embedded components with Cranelift takes most of a second, which
//! every fresh data directory used to pay (wasmtime's own cache lived in
//! `DATA_DIR/cache`). Three ways out were weighed:
//!
//! - wasmtime's built-in cache in one directory every data directory shares: a hit still
//!   reads and zstd-decompresses the whole artifact and copies it into fresh executable
//!   memory (most of a warm data directory's start);
//! - precompiling at build time: the build script would need wasmtime with Cranelift as a
//!   build dependency — a second full wasmtime build in every clean build, and the
//!   artifact would be tied to the build machine's CPU features;
//! - **chosen**: our own cache of precompiled artifacts ([`Engine::precompile_component`]'s
//!   output, wasmtime's `.cwasm`), shared by every data directory (`[server] compile-cache`,
//!   `$POOLER_CACHE_DIR`, else the platform's cache directory, see
//!   [`crate::cli::compile_cache_dir`]). A hit is [`Component::deserialize_file`], which maps
//!   the file instead of reading and decompressing it, so only the first start on a machine
//!   compiles. The start times this buys are in `docs/05-request-cost.md`.
//!
//! An entry is named by a SHA-256 of the component's bytes and of the engine's compatibility
//! hash ([`Engine::precompile_compatibility_hash`]: wasmtime's version, the target, the
//! compiler flags, every setting that shapes the code), so a changed component, wasmtime or
//! setting never finds a stale entry. It is written to a temporary file (0600) in the cache
//! directory (0700) and renamed into place, so a second server starting at the same moment
//! finds the whole file or none; a file is never rewritten in place, so a mapping another
//! process holds never changes under it.
//!
//! Deserializing is `unsafe` because wasmtime runs the machine code in the file as it is:
//! a file crafted by someone else would run their code in this process. Our use is sound
//! because the directory and the file must be owned by the user running the host and not be
//! writable by anyone else (checked before every use; a directory that fails the check is
//! not used), and we write every entry ourselves from our own compilation. wasmtime checks
//! the rest when it loads one — that it is an artifact of this wasmtime version, target and
//! configuration, and that its ELF image parses — so a truncated, corrupt or stale entry is
//! an error, which we answer by compiling again and replacing the entry, never by trusting
//! it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

use anyhow::Context;
use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances. A guest's CPU budget is counted in these ticks, so a
/// runaway guest is stopped within about one tick of its deadline.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Dirty bytes of a freed linear memory reset in place (kept resident) rather than
/// returned to the kernel; a plugin call dirties a few hundred KiB. Bounds the memory a warm
/// pool slot keeps.
const KEEP_RESIDENT_MEMORY_BYTES: usize = 2 << 20;
/// The same for a freed table's pages.
const KEEP_RESIDENT_TABLE_BYTES: usize = 1 << 20;

/// Limits of the pooling allocator: how many instances may be alive at once (one per
/// in-flight request or plugin call) and the largest memory one may have.
#[derive(Debug, Clone, Copy)]
pub struct EngineLimits {
    /// The most instances alive at once.
    pub max_instances: u32,
    /// The largest linear memory one instance may have, in bytes.
    pub max_memory_bytes: usize,
}

/// Build the engine. Compiled components are cached by [`load_component`], not by wasmtime.
pub fn build(limits: EngineLimits) -> anyhow::Result<Engine> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    // No WASI 0.3 / component-model async here: turning concurrency support off makes every
    // call cheaper, and the pool makes several calls per request.
    config.concurrency_support(false);
    // Deadlines: guests check the epoch at loop heads and function entries.
    config.epoch_interruption(true);
    // For profiling: name the guests' compiled functions in /tmp/perf-<pid>.map, which
    // `perf report` reads. Costs a little at load time only.
    if std::env::var_os("POOLER_PERF_MAP").is_some_and(|v| v == "1") {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    // Stores and instances from pre-allocated slots: instantiation about twice as fast,
    // which matters with a fresh instance per request.
    let mut pooling = PoolingAllocationConfig::default();
    pooling
        .total_component_instances(limits.max_instances)
        .total_core_instances(limits.max_instances * 4)
        .total_memories(limits.max_instances * 2)
        .total_tables(limits.max_instances * 4)
        .max_memories_per_component(4)
        .max_core_instances_per_component(16)
        .max_tables_per_component(8)
        .max_memory_size(limits.max_memory_bytes);
    // Reset a slot for its next instance without giving its pages back to the kernel. By
    // default a freed slot's memory and tables are reset with `madvise`, so each fresh
    // instance page-faults the pages it touches in again (and every `madvise` is a TLB
    // shootdown across cores): measured ~3 `madvise` and ~5 page faults per plugin call,
    // over half the call's time. With the `PAGEMAP_SCAN` ioctl (Linux 6.7+) wasmtime finds
    // the pages an instance dirtied and restores just those with `memset`/copy, up to the
    // bytes kept resident; nothing leaks between instances either way. Without that ioctl,
    // keeping pages resident would `memset` the whole kept range on every free, which
    // costs more than it saves, so the defaults stay.
    if PoolingAllocationConfig::is_pagemap_scan_available() {
        pooling
            .pagemap_scan(Enabled::Yes)
            .linear_memory_keep_resident(KEEP_RESIDENT_MEMORY_BYTES)
            .table_keep_resident(KEEP_RESIDENT_TABLE_BYTES);
    }
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
    Engine::new(&config)
        .map_err(anyhow::Error::from)
        .context("cannot create the wasmtime engine")
}

/// Advance `engine`'s epoch every [`EPOCH_TICK`] on a thread of its own, until the engine is
/// dropped. Without it no deadline fires, so failing to start it is an error.
pub fn start_ticker(engine: &Engine) -> anyhow::Result<()> {
    let weak = engine.weak();
    thread::Builder::new()
        .name("pooler-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                thread::sleep(EPOCH_TICK);
            }
        })
        .context("cannot start the epoch ticker thread")?;
    Ok(())
}

/// How [`load_component`] got its component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Mapped from the compile cache: nothing was compiled.
    Hit,
    /// Compiled, and stored in the cache (no entry existed).
    Compiled,
    /// The entry could not be used (the reason); compiled again and replaced.
    Recompiled(String),
    /// Compiled; no cache was used (none configured, or the reason it was refused).
    Uncached(Option<String>),
}

/// The component compiled from `bytes`, from the compile cache in `cache` when it holds an
/// entry for these bytes and this engine, else compiled (and then stored there).
pub fn load_component(
    engine: &Engine,
    bytes: &[u8],
    cache: Option<&Path>,
) -> anyhow::Result<(Component, CacheOutcome)> {
    let Some(dir) = cache else {
        return Ok((compile(engine, bytes)?, CacheOutcome::Uncached(None)));
    };
    if let Err(why) = private_dir(dir) {
        let why = format!("{why:#}");
        tracing::warn!(cache = %dir.display(), reason = %why, "compile cache not used");
        return Ok((compile(engine, bytes)?, CacheOutcome::Uncached(Some(why))));
    }
    let entry = dir.join(entry_name(engine, bytes));
    let outcome = match std::fs::symlink_metadata(&entry) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => CacheOutcome::Compiled,
        Err(e) => CacheOutcome::Recompiled(format!("cannot read it: {e}")),
        Ok(meta) => match private_file(&meta) {
            Err(why) => CacheOutcome::Recompiled(why),
            // SAFETY: the entry is a regular file owned by this user and writable by no one
            // else, in a directory with the same guarantee (`private_dir`), so only this
            // user's pooler wrote it, from its own compilation, by a rename that never
            // leaves a partial file. wasmtime checks that it is an artifact of this version
            // and configuration before using it; anything it refuses is compiled again below.
            Ok(()) => match unsafe { Component::deserialize_file(engine, &entry) } {
                Ok(component) => return Ok((component, CacheOutcome::Hit)),
                Err(e) => CacheOutcome::Recompiled(format!("{e:#}")),
            },
        },
    };
    if let CacheOutcome::Recompiled(why) = &outcome {
        tracing::warn!(entry = %entry.display(), reason = %why, "compile cache entry unusable; compiling again");
    }
    let component = compile(engine, bytes)?;
    let artifact = component
        .serialize()
        .map_err(anyhow::Error::from)
        .context("cannot serialize a compiled component")?;
    // A cache that cannot be written costs the next start a compile, nothing more.
    if let Err(e) = store(dir, &entry, &artifact) {
        tracing::warn!(entry = %entry.display(), error = %format!("{e:#}"), "cannot store a compiled component");
    }
    Ok((component, outcome))
}

fn compile(engine: &Engine, bytes: &[u8]) -> anyhow::Result<Component> {
    Component::new(engine, bytes).map_err(anyhow::Error::from)
}

/// Feeds what `Hash` writes into SHA-256, so the name is stable across Rust releases
/// (`DefaultHasher` is not).
struct ShaHasher(Sha256);

impl std::hash::Hasher for ShaHasher {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// The file name of `bytes`' entry for `engine`: `<sha-256>.cwasm`.
fn entry_name(engine: &Engine, bytes: &[u8]) -> String {
    use std::hash::Hash;
    let mut hasher = ShaHasher(Sha256::new());
    hasher.0.update(b"pooler-cwasm-1\0");
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hasher.0.update((bytes.len() as u64).to_le_bytes());
    hasher.0.update(bytes);
    let digest = hasher.0.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}.cwasm")
}

/// Create `dir` (0700) if needed and check it is this user's alone
/// ([`pooler_core::private_file::create_private_dir`]: one others can write is refused).
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    pooler_core::private_file::create_private_dir(dir)
        .with_context(|| format!("cannot use {}", dir.display()))
}

/// An entry must be a regular file (not a link) of this user's, writable by no one else.
fn private_file(meta: &std::fs::Metadata) -> Result<(), String> {
    if !meta.file_type().is_file() {
        return Err("not a regular file".into());
    }
    pooler_core::private_file::owned_and_private(meta)
}

/// Write `artifact` to `entry` atomically: a private temporary file in the same directory,
/// flushed to disk, then renamed over the entry.
fn store(dir: &Path, entry: &Path, artifact: &[u8]) -> anyhow::Result<()> {
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(|e| anyhow::anyhow!("no random bytes: {e}"))?;
    let temp: PathBuf = dir.join(format!(
        ".{}.{}.{:016x}.tmp",
        entry
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("entry"),
        std::process::id(),
        u64::from_le_bytes(nonce)
    ));
    let written = (|| {
        let mut file = pooler_core::private_file::create_private_file(
            &temp,
            pooler_core::private_file::Existing::Fail,
        )?;
        file.write_all(artifact)?;
        file.sync_all()?;
        std::fs::rename(&temp, entry)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written.with_context(|| format!("cannot write {}", entry.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest component: the preamble and nothing else (compiles in microseconds).
    const EMPTY: &[u8] = b"\0asm\x0d\x00\x01\x00";
    /// Another small component: the same with a custom section, so different bytes.
    const OTHER: &[u8] = b"\0asm\x0d\x00\x01\x00\x00\x04\x03abc";

    fn engine() -> Engine {
        build(EngineLimits {
            max_instances: 4,
            max_memory_bytes: 16 << 20,
        })
        .unwrap()
    }

    fn entries(dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
    }

    #[test]
    fn a_second_load_maps_the_entry_the_first_stored() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let engine = engine();
        let (_, first) = load_component(&engine, EMPTY, Some(&cache)).unwrap();
        assert_eq!(first, CacheOutcome::Compiled);
        let stored = entries(&cache);
        assert_eq!(
            stored.len(),
            1,
            "one entry and no temporary file: {stored:?}"
        );
        assert!(stored[0].to_string_lossy().ends_with(".cwasm"));
        // Another engine with the same settings (another server) finds it.
        let (_, second) = load_component(&self::engine(), EMPTY, Some(&cache)).unwrap();
        assert_eq!(second, CacheOutcome::Hit);
        // Other bytes are another entry.
        let (_, other) = load_component(&engine, OTHER, Some(&cache)).unwrap();
        assert_eq!(other, CacheOutcome::Compiled);
        assert_eq!(entries(&cache).len(), 2);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&cache), 0o700);
            assert_eq!(mode(&stored[0]), 0o600);
        }
    }

    #[test]
    fn a_corrupt_or_truncated_entry_is_compiled_again_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().to_path_buf();
        let engine = engine();
        load_component(&engine, EMPTY, Some(&cache)).unwrap();
        let entry = entries(&cache).remove(0);
        let good = std::fs::read(&entry).unwrap();
        let damaged = [
            b"not an artifact at all".to_vec(),
            good[..good.len() / 2].to_vec(),
            Vec::new(),
        ];
        for bad in damaged {
            // Replaced, not rewritten in place (as a damaged disk or an old pooler might).
            std::fs::remove_file(&entry).unwrap();
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            options.open(&entry).unwrap().write_all(&bad).unwrap();
            let (_, outcome) = load_component(&engine, EMPTY, Some(&cache)).unwrap();
            assert!(
                matches!(outcome, CacheOutcome::Recompiled(_)),
                "{} bytes: {outcome:?}",
                bad.len()
            );
            assert_eq!(
                std::fs::read(&entry).unwrap(),
                good,
                "the entry is replaced"
            );
            let (_, again) = load_component(&engine, EMPTY, Some(&cache)).unwrap();
            assert_eq!(again, CacheOutcome::Hit);
        }
    }

    #[test]
    fn an_entry_from_an_engine_with_other_settings_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().to_path_buf();
        // An artifact of a different configuration, planted under this engine's name (as a
        // stale entry would be, were the name not to change with the settings).
        let mut config = Config::new();
        config.wasm_component_model(true);
        let foreign = Engine::new(&config).unwrap();
        let artifact = foreign.precompile_component(EMPTY).unwrap();
        let engine = engine();
        let entry = cache.join(entry_name(&engine, EMPTY));
        store(&cache, &entry, &artifact).unwrap();
        let (_, outcome) = load_component(&engine, EMPTY, Some(&cache)).unwrap();
        let CacheOutcome::Recompiled(why) = outcome else {
            panic!("used a foreign artifact: {outcome:?}");
        };
        assert!(!why.is_empty());
        // And the settings are part of the name.
        assert_ne!(entry_name(&foreign, EMPTY), entry_name(&engine, EMPTY));
    }

    #[cfg(unix)]
    #[test]
    fn a_cache_others_can_write_is_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("shared");
        std::fs::create_dir(&cache).unwrap();
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
        let (_, outcome) = load_component(&engine(), EMPTY, Some(&cache)).unwrap();
        assert!(
            matches!(&outcome, CacheOutcome::Uncached(Some(why)) if why.contains("writable by others")),
            "{outcome:?}"
        );
        assert!(entries(&cache).is_empty(), "nothing stored there");

        // An entry others can write is compiled again (and replaced by a private one).
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
        load_component(&engine(), EMPTY, Some(&cache)).unwrap();
        let entry = entries(&cache).remove(0);
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o666)).unwrap();
        let (_, outcome) = load_component(&engine(), EMPTY, Some(&cache)).unwrap();
        assert!(
            matches!(outcome, CacheOutcome::Recompiled(_)),
            "{outcome:?}"
        );
        let mode = std::fs::metadata(&entry).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
