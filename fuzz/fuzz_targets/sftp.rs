//! `core::sftp::SftpAudit`, which reads every SFTP packet passing through the proxy: client
//! and server bytes in any chunking. It must never panic, and it stops at its first error
//! (the proxy then ends the channel).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sallyport_core::sftp::SftpAudit;

mod chunks;

fuzz_target!(|data: &[u8]| {
    let mut audit = SftpAudit::new();
    for (server, chunk) in chunks::chunks(data) {
        let r = if server {
            audit.server(chunk)
        } else {
            audit.client(chunk)
        };
        let _ = audit.take();
        if r.is_err() {
            break;
        }
    }
    let _ = audit.finish();
});
