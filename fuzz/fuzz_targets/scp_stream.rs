//! `core::scp`'s legacy scp stream readers: the sending side's `T`/`C`/`D`/`E` headers and file
//! contents (`ScpStream`) and the receiving side's answers (`ScpAnswers`), in any chunking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sallyport_core::scp::{ScpAnswers, ScpStream};

mod chunks;

fuzz_target!(|data: &[u8]| {
    let (mut stream, mut answers) = (ScpStream::new(), ScpAnswers::new());
    let (mut stream_ok, mut answers_ok) = (true, true);
    for (answer, chunk) in chunks::chunks(data) {
        if answer && answers_ok {
            answers_ok = answers.feed(chunk).is_ok();
        } else if !answer && stream_ok {
            stream_ok = stream.feed(chunk).is_ok();
            for f in stream.take() {
                // A name is a path under the copy's root: never absolute, never `..`.
                assert!(!f.name.starts_with('/'), "{f:?}");
                assert!(
                    !f.name.split('/').any(|p| p == ".." || p.is_empty()),
                    "{f:?}"
                );
            }
        }
    }
});
