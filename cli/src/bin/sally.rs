//! `sally`: the user's client. Its commands live in `sallyport_cli::sally`.

fn main() -> std::process::ExitCode {
    sallyport_cli::sally::main()
}
