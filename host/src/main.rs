//! The `pooler` binary: see `pooler --help`.

fn main() -> std::process::ExitCode {
    pooler_host::cli::main()
}
