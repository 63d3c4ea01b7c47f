//! `core::scp`'s reading of an exec request's command (which commands are file copies, and the
//! words an agent runs one with): any text a client sends.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sallyport_core::scp;

fuzz_target!(|data: &[u8]| {
    let Ok(command) = std::str::from_utf8(data) else {
        return;
    };
    let _ = scp::mentions_copy(command);
    let parsed = scp::parse(command);
    assert_eq!(
        parsed.as_ref().map(|c| c.copy.clone()),
        scp::classify(command)
    );
    if let Some(c) = parsed {
        // What an agent runs: a known program and arguments without a NUL (exec would fail).
        assert!(matches!(c.program(), "scp" | "rsync") || scp::SFTP_SERVERS.contains(&c.program()));
        for a in c.args("/home/someone") {
            assert!(!a.contains('\0'), "{command:?}");
        }
    }
});
