//! `sally`: the user's client. Its commands live in `sallyport_cli::sally`.

/// mimalloc, as the daemon: `sally ls` reads a listing of every node the user reaches.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    sallyport_cli::sally::main()
}
