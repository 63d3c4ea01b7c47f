//! `sallyctl`: the admin's client. Its commands live in `sallyport_cli::sallyctl`.

fn main() -> std::process::ExitCode {
    sallyport_cli::sallyctl::main()
}
