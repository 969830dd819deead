//! What the benchmarks share: the runtime they run on.

/// Worker threads of a benchmark's runtime: the load generator, the host and the fake
/// upstream share them, as on the 2-core machines the figures are measured on.
pub const WORKERS: usize = 2;

/// Run a benchmark's `main` body on a multi-threaded runtime of [`WORKERS`] threads.
pub fn run(body: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()?
        .block_on(body)
}
