//! The manager binary: runs every enabled controller behind leader election.
//!
//! Exit status: 0 after a clean shutdown (SIGTERM, SIGINT), 2 for an invalid configuration or
//! command line, 1 for any other failure (including lost leadership).

use std::process::ExitCode;

use manager::config::{self, Flags};

/// jemalloc, not the system allocator: with thousands of objects cached, glibc's malloc held on
/// to a sixth of the manager's peak memory after it was freed.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let flags = Flags::parse();
    // Before any controller is built: their watches select on these labels.
    if let Err(error) = kube_operator_runtime::labels::set_product(product::NAME, product::PART_OF)
    {
        eprintln!("error: {error}");
        return ExitCode::FAILURE;
    }
    let all = controllers::all();
    let names: Vec<&str> = all.iter().map(|c| c.name()).collect();
    // Every registered controller's webhooks are served, enabled or not: the cluster calls
    // them for every write of their types.
    let webhooks = match manager::webhooks::DeclaredWebhooks::of(&all) {
        Ok(webhooks) => webhooks,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let env = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
    let config = match config::load(&flags, env, &names) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    if let Err(error) = manager::telemetry::init_logging(&config) {
        eprintln!("error: {error}");
        return ExitCode::FAILURE;
    }
    let enabled = match manager::enabled_controllers(&config, all) {
        Ok(enabled) => enabled,
        Err(error) => {
            eprintln!("error: invalid configuration: controllers: {error}");
            return ExitCode::from(2);
        }
    };
    // One thread runs every controller: a manager waits on the API server far more than it
    // computes (0.03 of a core on average at 10,000 objects), and one thread spares the wake-ups
    // between worker threads and their allocator caches: a tenth less CPU and 1.5 MiB less
    // memory than tokio's multi-threaded runtime, at the same speed, measured by the bench.
    // Blocking work (webhook reviews) still goes to tokio's blocking threads.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(manager::manager::run(config, enabled, webhooks)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let code = error.exit_code();
            eprintln!("error: {}", error.report());
            ExitCode::from(code)
        }
    }
}
