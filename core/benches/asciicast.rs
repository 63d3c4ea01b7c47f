//! What recording costs per byte: a session's bytes turned into asciicast text, for the two
//! shapes they take — terminal text (mostly ASCII, some UTF-8) and a binary transfer (random
//! bytes, half of them invalid UTF-8). Both directions of every recorded session go through
//! this, so it bounds the throughput of a recorded `cat FILE | ssh node cat`. The byte-at-a-time
//! decoder it replaced ran at ~70 MiB/s on random bytes on the 2-core machine of RESULTS.md.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sallyport_core::asciicast::escape_lossy_into;

/// One SSH packet's worth: what the recorder is handed at a time in a bulk transfer.
const CHUNK: usize = 32 * 1024;

fn random(n: usize) -> Vec<u8> {
    use rand::Rng;
    let mut data = vec![0u8; n];
    rand::rng().fill_bytes(&mut data);
    data
}

fn escape(c: &mut Criterion) {
    let inputs: [(&str, Vec<u8>); 3] = [
        ("random bytes", random(1 << 20)),
        ("source code", include_bytes!("../src/role.rs").repeat(16)),
        (
            "UTF-8 text",
            "Grüße aus Köln — テキスト ☃ résumé naïve\r\n"
                .repeat(20_000)
                .into_bytes(),
        ),
    ];
    let mut g = c.benchmark_group("asciicast escape");
    for (name, data) in &inputs {
        g.throughput(Throughput::Bytes(data.len() as u64));
        let mut buf = Vec::new();
        g.bench_function(*name, |b| {
            b.iter(|| {
                for chunk in data.chunks(CHUNK) {
                    let n = escape_lossy_into(black_box(chunk), &mut buf);
                    black_box(&buf[..n]);
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, escape);
criterion_main!(benches);
