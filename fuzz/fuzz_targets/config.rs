//! The daemon's config file parser (`daemon/src/config.rs`, compiled in from its file: the
//! daemon is a binary crate): any text must give a config or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../daemon/src/config.rs"]
mod config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = config::Config::parse(text) {
        let _ = c.storage_url();
        let _ = c.proxy_service.web_door_limits();
    }
});
