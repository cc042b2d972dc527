//! The `kiln` binary: parses the command line, runs the command, prints errors and owns the
//! exit codes (0 ok, 1 the run failed, 2 bad input).

use clap::Parser;

fn main() {
    quiet_on_closed_stdout();
    // NCCL found but not loadable: re-execute with it on the library path, before anything runs
    #[cfg(feature = "cuda")]
    if let Some(warning) = kiln::cuda::ensure_nccl_loadable() {
        eprintln!("{warning}");
    }
    let cli = kiln::cli::Cli::parse();
    let code = match kiln::cli::dispatch(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    };
    std::process::exit(code);
}

/// `kiln ... | head` closes the pipe early; printing then fails, and Rust's `println!` panics.
/// Stop quietly with 0 instead, as ripgrep does (SIGPIPE stays ignored so that sockets keep
/// returning errors rather than killing the process).
fn quiet_on_closed_stdout() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info.payload_as_str().unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        default_hook(info);
    }));
}

/// Large tensors are allocated and freed every step; the system allocator returns them to the
/// OS each time (page faults dominated a profile), mimalloc keeps and reuses them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
