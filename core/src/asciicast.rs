//! The text half of asciicast v2 recordings: a session's bytes turned into the inside of a JSON
//! string, read as UTF-8 the way `String::from_utf8_lossy` reads it (one U+FFFD per maximal
//! invalid subpart) and escaped as JSON requires.
//!
//! Every byte a recorded session carries, both ways, goes through here, so it is built for
//! speed on the two shapes a session's bytes take. Terminal text is mostly plain ASCII: runs of
//! it are copied at once. A binary transfer (`cat image.png`, `tar c | ssh node tar x`) is half
//! invalid UTF-8 and defeats any branch on the kind of byte (the old byte-at-a-time decoder ran
//! at ~70 MiB/s on random bytes and was the proxy's bottleneck); for that shape the bytes go
//! through a UTF-8 automaton with no data-dependent branch, a shift-based DFA whose next state
//! costs a shift and a mask, with table-driven output. `bench/` measures both
//! (`cargo bench -p sallyport-core --bench asciicast`).
//!
//! This module owns no I/O; the recorder that writes the file lives in the proxy.

/// Escapes `b` into `buf` and returns how many bytes of `buf` hold the result.
///
/// `buf` is working space: it is grown (zero-filled, never shrunk) to fit the worst case, and
/// the escaped text is `buf[..n]`. Reusing one `buf` per recording avoids both allocating and
/// zero-filling per event. A UTF-8 sequence cut short at the end of `b` comes out as U+FFFD;
/// callers that receive a stream in pieces keep such a tail back with [`incomplete_tail`].
pub fn escape_lossy_into(b: &[u8], buf: &mut Vec<u8>) -> usize {
    // Worst case per input byte is 6 bytes out (`\u00XX`); each step may write up to 11 bytes
    // past its position (a U+FFFD and an 8-byte table entry) before trimming its length.
    let room = b.len() * 6 + 16;
    if buf.len() < room {
        buf.resize(room, 0);
    }
    // Mostly ASCII: copy runs. Otherwise: the branch-free automaton.
    let high = b.iter().filter(|&&c| c >= 0x80).count();
    if high * 16 <= b.len() {
        escape_text(b, buf)
    } else {
        escape_binary(b, buf)
    }
}

/// Appends `b`, escaped, to `out` (a convenience over [`escape_lossy_into`]).
pub fn escape_lossy(b: &[u8], out: &mut Vec<u8>) {
    let mut buf = Vec::new();
    let n = escape_lossy_into(b, &mut buf);
    out.extend_from_slice(&buf[..n]);
}

/// How many bytes at the end of `b` start a UTF-8 sequence that `b` cuts short (0 to 3).
pub fn incomplete_tail(b: &[u8]) -> usize {
    for back in 1..=3.min(b.len()) {
        let byte = b[b.len() - back];
        if byte & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back
        }
        let need = match byte {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return 0,
        };
        return if need > back { back } else { 0 };
    }
    0
}

const REPLACEMENT: [u8; 3] = [0xEF, 0xBF, 0xBD];

/// What byte `c` becomes when it does not continue a sequence: up to 6 bytes of JSON, padded
/// to 8 so that every entry is copied with one fixed-size store. A lead byte comes out as
/// itself (the automaton takes it back if its sequence breaks); a byte that can only be a
/// continuation, or never appears in UTF-8, becomes U+FFFD.
const fn single(c: u8) -> ([u8; 8], u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut e = [0u8; 8];
    let len = match c {
        b'"' | b'\\' => {
            e[0] = b'\\';
            e[1] = c;
            2
        }
        b'\n' | b'\r' | b'\t' => {
            e[0] = b'\\';
            e[1] = match c {
                b'\n' => b'n',
                b'\r' => b'r',
                _ => b't',
            };
            2
        }
        0..=0x1f => {
            e[0] = b'\\';
            e[1] = b'u';
            e[2] = b'0';
            e[3] = b'0';
            e[4] = HEX[(c >> 4) as usize];
            e[5] = HEX[(c & 15) as usize];
            6
        }
        0x20..=0x7f | 0xC2..=0xF4 => {
            e[0] = c;
            1
        }
        _ => {
            e[0] = REPLACEMENT[0];
            e[1] = REPLACEMENT[1];
            e[2] = REPLACEMENT[2];
            3
        }
    };
    (e, len)
}

/// Output entries: `[c]` for `c` on its own, `[256 + c]` for `c` accepted as a continuation
/// byte (copied as itself).
struct Output {
    bytes: [[u8; 8]; 512],
    len: [u8; 512],
}

const fn output_table() -> Output {
    let mut t = Output {
        bytes: [[0; 8]; 512],
        len: [0; 512],
    };
    let mut c = 0;
    while c < 256 {
        let (e, l) = single(c as u8);
        t.bytes[c] = e;
        t.len[c] = l;
        t.bytes[256 + c] = [c as u8, 0, 0, 0, 0, 0, 0, 0];
        t.len[256 + c] = 1;
        c += 1;
    }
    t
}

static OUTPUT: Output = output_table();

/// The automaton's states: 0 between sequences; otherwise how many continuation bytes a
/// started sequence still needs and the range the next one must fall in (RFC 3629's table,
/// which rules out overlong forms, surrogates and code points past U+10FFFF).
const fn accepts(state: u8, c: u8) -> Option<u8> {
    let (lo, hi, next) = match state {
        1 => (0x80, 0xBF, 0), // one more
        2 => (0x80, 0xBF, 1), // two more
        3 => (0x80, 0xBF, 2), // three more
        4 => (0xA0, 0xBF, 1), // after E0
        5 => (0x80, 0x9F, 1), // after ED
        6 => (0x90, 0xBF, 2), // after F0
        7 => (0x80, 0x8F, 2), // after F4
        _ => return None,
    };
    if c >= lo && c <= hi { Some(next) } else { None }
}

/// The state a lead byte starts (0 for a byte that starts nothing).
const fn starts(c: u8) -> u8 {
    match c {
        0xC2..=0xDF => 1,
        0xE0 => 4,
        0xE1..=0xEC | 0xEE..=0xEF => 2,
        0xED => 5,
        0xF0 => 6,
        0xF1..=0xF3 => 3,
        0xF4 => 7,
        _ => 0,
    }
}

/// Per byte `c`, for every state `s` at bit offset `6 * s`: the next state (times 6, so it is
/// directly the next shift) in `next[c]`; in `flags[c]`, bit 0 "c continued the sequence" and
/// bit 1 "c starts a sequence". The next state is then `(next[c] >> state) & 63`: one shift and
/// one mask on the critical path, no branch.
struct Automaton {
    next: [u64; 256],
    flags: [u64; 256],
}

const ACCEPTED: u64 = 1;
const STARTS: u64 = 2;

const fn automaton() -> Automaton {
    let mut a = Automaton {
        next: [0; 256],
        flags: [0; 256],
    };
    let mut c = 0;
    while c < 256 {
        let mut s = 0;
        while s < 8 {
            let (next, flags) = match accepts(s as u8, c as u8) {
                Some(n) => (n, ACCEPTED),
                None => {
                    let n = starts(c as u8);
                    (n, if n != 0 { STARTS } else { 0 })
                }
            };
            a.next[c] |= ((next as u64) * 6) << (s * 6);
            a.flags[c] |= flags << (s * 6);
            s += 1;
        }
        c += 1;
    }
    a
}

static AUTOMATON: Automaton = automaton();

/// The automaton. Bytes of a sequence are written as they come; when a byte breaks the
/// sequence, the output goes back to where it began and one U+FFFD takes its place, as
/// `from_utf8_lossy` has it. Every step does the same work whatever the byte.
fn escape_binary(b: &[u8], buf: &mut [u8]) -> usize {
    let (next, flags) = (&AUTOMATON.next, &AUTOMATON.flags);
    let mut pos = 0usize;
    // Where the pending sequence's output began.
    let mut seq = 0usize;
    let mut state = 0u64;
    for &c in b {
        let s = state;
        state = (next[c as usize] >> s) & 63;
        let f = (flags[c as usize] >> s) & 3;
        let accepted = (f & ACCEPTED) as usize;
        let broken = (s != 0) as usize & (accepted ^ 1);
        let m = broken.wrapping_neg();
        pos = (seq & m) | (pos & !m);
        buf[pos..pos + 3].copy_from_slice(&REPLACEMENT);
        pos += 3 * broken;
        let l = ((f >> 1) as usize).wrapping_neg();
        seq = (pos & l) | (seq & !l);
        let k = c as usize + 256 * accepted;
        buf[pos..pos + 8].copy_from_slice(&OUTPUT.bytes[k]);
        pos += usize::from(OUTPUT.len[k]);
    }
    if state != 0 {
        // Cut short at the end.
        pos = seq;
        buf[pos..pos + 3].copy_from_slice(&REPLACEMENT);
        pos += 3;
    }
    pos
}

/// Mostly-ASCII text: runs of plain ASCII copied at once, everything else a byte (or a
/// sequence) at a time.
fn escape_text(b: &[u8], buf: &mut [u8]) -> usize {
    let plain = |c: u8| (0x20..0x80).contains(&c) && c != b'"' && c != b'\\';
    let mut pos = 0usize;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if plain(c) {
            let start = i;
            while i < b.len() && plain(b[i]) {
                i += 1;
            }
            buf[pos..pos + (i - start)].copy_from_slice(&b[start..i]);
            pos += i - start;
            continue;
        }
        let state = starts(c);
        if state == 0 {
            buf[pos..pos + 8].copy_from_slice(&OUTPUT.bytes[usize::from(c)]);
            pos += usize::from(OUTPUT.len[usize::from(c)]);
            i += 1;
            continue;
        }
        // A lead byte: follow the same automaton to the sequence's end or its break.
        let mut s = state;
        let mut j = i + 1;
        while s != 0 {
            match b.get(j).and_then(|&n| accepts(s, n)) {
                Some(n) => {
                    s = n;
                    j += 1;
                }
                None => break,
            }
        }
        if s == 0 {
            buf[pos..pos + (j - i)].copy_from_slice(&b[i..j]);
            pos += j - i;
        } else {
            buf[pos..pos + 3].copy_from_slice(&REPLACEMENT);
            pos += 3;
        }
        i = j;
    }
    pos
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What the escaped text must read as: the lossy string.
    fn expected(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    /// Both paths, whichever the input would pick.
    fn both(b: &[u8]) -> [String; 2] {
        let mut buf = vec![0; b.len() * 6 + 16];
        let t = escape_text(b, &mut buf);
        let text = decode(&buf[..t]);
        let n = escape_binary(b, &mut buf);
        let binary = decode(&buf[..n]);
        [text, binary]
    }

    /// The escaped text read back by a JSON parser (which also proves it valid JSON).
    fn decode(escaped: &[u8]) -> String {
        let quoted = [b"\"", escaped, b"\""].concat();
        serde_json::from_slice(&quoted).unwrap_or_else(|e| panic!("{e}: {escaped:?}"))
    }

    #[test]
    fn table_of_cases() {
        let cases: &[(&[u8], &str)] = &[
            (b"", ""),
            (b"plain", "plain"),
            (b"a\"b\\c", "a\"b\\c"),
            (b"\n\r\t\x00\x1b\x7f", "\n\r\t\u{0}\u{1b}\u{7f}"),
            ("☃ é 😀".as_bytes(), "☃ é 😀"),
            (b"\xff", "\u{fffd}"),
            (b"\x80\x80", "\u{fffd}\u{fffd}"),
            (b"\xe2\x98", "\u{fffd}"),   // cut short: one replacement
            (b"\xe2\x98x", "\u{fffd}x"), // broken by ASCII
            (b"\xe2\xe2\x98\x83", "\u{fffd}☃"), // broken by a lead that starts a good one
            (b"\xe0\x80\x80", "\u{fffd}\u{fffd}\u{fffd}"), // overlong
            (b"\xed\xa0\x80", "\u{fffd}\u{fffd}\u{fffd}"), // surrogate
            (b"\xf4\x90\x80\x80", "\u{fffd}\u{fffd}\u{fffd}\u{fffd}"), // past U+10FFFF
            (b"\xf0\x9f\x98", "\u{fffd}"),
            (b"\xf0\x9f\x98\"", "\u{fffd}\""),
            (b"\xc0\xaf", "\u{fffd}\u{fffd}"),
        ];
        for (input, want) in cases {
            assert_eq!(
                String::from_utf8_lossy(input),
                *want,
                "the case itself: {input:?}"
            );
            for (path, got) in ["text", "binary"].iter().zip(both(input)) {
                assert_eq!(got, *want, "{path} path on {input:?}");
            }
        }
    }

    #[test]
    fn random_bytes_take_the_binary_path_and_match_from_utf8_lossy() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let data: Vec<u8> = (0..200_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        let mut buf = Vec::new();
        let n = escape_lossy_into(&data, &mut buf);
        assert_eq!(decode(&buf[..n]), expected(&data));
        // A short buffer that held a long event is reused without being cut.
        let n = escape_lossy_into(b"short \xff", &mut buf);
        assert_eq!(decode(&buf[..n]), "short \u{fffd}");
    }

    proptest! {
        #[test]
        fn both_paths_match_from_utf8_lossy(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let want = expected(&b);
            for got in both(&b) {
                prop_assert_eq!(&got, &want);
            }
        }

        #[test]
        fn mostly_text_with_some_utf8(s in "[ -~\n\t☃é😀\u{1b}]{0,100}", junk in proptest::collection::vec(any::<u8>(), 0..4)) {
            let mut b = s.into_bytes();
            let at = b.len() / 2;
            b.splice(at..at, junk);
            let want = expected(&b);
            for got in both(&b) {
                prop_assert_eq!(&got, &want);
            }
        }

        #[test]
        fn a_stream_cut_anywhere_reads_the_same_when_the_tail_waits(b in proptest::collection::vec(any::<u8>(), 0..24), cut in 0usize..25) {
            let (head, rest) = b.split_at(cut.min(b.len()));
            let keep = incomplete_tail(head);
            prop_assert!(keep <= 3);
            let (first, tail) = head.split_at(head.len() - keep);
            let second = [tail, rest].concat();
            let mut got = Vec::new();
            escape_lossy(first, &mut got);
            escape_lossy(&second, &mut got);
            prop_assert_eq!(decode(&got), expected(&b));
        }
    }
}
