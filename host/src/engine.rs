//! The one wasmtime `Engine` and its settings, each chosen for a reason written beside it,
//! and the epoch ticker that lets the host stop a guest that runs past its deadline.

use std::path::Path;
use std::thread;
use std::time::Duration;

use anyhow::Context;
use wasmtime::{
    Cache, CacheConfig, Config, Enabled, Engine, InstanceAllocationStrategy,
    PoolingAllocationConfig,
};

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
    pub max_instances: u32,
    pub max_memory_bytes: usize,
}

/// Build the engine. `cache_dir` holds compiled components (wasmtime's on-disk cache), so
/// only the first start after a change compiles (50–250 ms per component with Cranelift).
pub fn build(limits: EngineLimits, cache_dir: Option<&Path>) -> anyhow::Result<Engine> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    // No WASI 0.3 / component-model async here: turning concurrency support off makes every
    // call cheaper (`shared/TOOLCHAIN.md`: a no-op call 525 -> 171 ns).
    config.concurrency_support(false);
    // Deadlines: guests check the epoch at loop heads and function entries.
    config.epoch_interruption(true);
    // For profiling: name the guests' compiled functions in /tmp/perf-<pid>.map, which
    // `perf report` reads. Costs a little at load time only.
    if std::env::var_os("POOLER_PERF_MAP").is_some_and(|v| v == "1") {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    // Stores and instances from pre-allocated slots: instantiation ~7 µs instead of 13 µs,
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
    if let Some(dir) = cache_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the compile cache {}", dir.display()))?;
        let mut cache = CacheConfig::new();
        cache.with_directory(dir);
        let cache = Cache::new(cache)
            .map_err(crate::wasmtime_error)
            .context("cannot open the compile cache")?;
        config.cache(Some(cache));
    }
    Engine::new(&config)
        .map_err(crate::wasmtime_error)
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
