//! The text half of asciicast v2 recordings: a session's bytes turned into the inside of a JSON
//! string, read as UTF-8 the way `String::from_utf8_lossy` reads it (one U+FFFD per maximal
//! invalid subpart) and escaped as JSON requires.
//!
//! Every byte a recorded session carries, both ways, goes through here, so it is built for
//! speed on the two shapes a session's bytes take. Terminal text is mostly plain ASCII: runs of
//! it are copied eight bytes at a time. A binary transfer (`cat image.png`, `tar c | ssh node tar x`) is half
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
    // Worst case per input byte is 6 bytes out (`\u00XX`); each step writes a 16-byte entry
    // at its position before advancing by the entry's length.
    let room = b.len() * 6 + 32;
    if buf.len() < room {
        buf.resize(room, 0);
    }
    // Mostly ASCII: copy runs. Otherwise: the branch-free automaton. Both give the same text,
    // so a sample of every eighth byte is enough to choose (a full count cost as much as a
    // tenth of the escaping).
    let sampled = b.iter().step_by(8);
    let (n, high) = sampled.fold((0usize, 0usize), |(n, h), &c| {
        (n + 1, h + usize::from(c >= 0x80))
    });
    if high * 16 <= n {
        escape_text(b, buf)
    } else {
        escape_binary(b, buf)
    }
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

/// What byte `c` becomes when it does not continue a sequence: up to 6 bytes of JSON. A lead byte comes out as
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

/// What the automaton writes for one byte, 16 bytes copied with one store, the length in the
/// last byte. `[c]`: `c` on its own; `[256 + c]`: `c` continuing a sequence (itself);
/// `[512 + c]`: a U+FFFD for the sequence `c` broke, then `c` on its own. The last quarter is
/// never used: it makes every index the automaton can form provably in bounds.
const fn entries() -> [[u8; 16]; 1024] {
    let mut t = [[0u8; 16]; 1024];
    let mut c = 0;
    while c < 256 {
        let (e, l) = single(c as u8);
        let mut j = 0;
        while j < 8 {
            t[c][j] = e[j];
            j += 1;
        }
        t[c][15] = l;
        t[256 + c][0] = c as u8;
        t[256 + c][15] = 1;
        t[512 + c][0] = REPLACEMENT[0];
        t[512 + c][1] = REPLACEMENT[1];
        t[512 + c][2] = REPLACEMENT[2];
        let mut j = 0;
        while j < 6 {
            t[512 + c][3 + j] = e[j];
            j += 1;
        }
        t[512 + c][15] = 3 + l;
        c += 1;
    }
    t
}

static ENTRY: [[u8; 16]; 1024] = entries();

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

/// One step of the automaton per byte `c`: for every state `s`, byte `s` of `STEP[c]` holds
/// bit 0 "c continued the sequence", bit 1 "c starts a sequence", bit 2 "c broke the pending
/// sequence", and in bits 3-5 the next state. With the state kept as `8 * s`, the next one is
/// `(STEP[c] >> state) & 0x38`: a shift and a mask on the critical path, no branch.
const fn steps() -> [u64; 256] {
    let mut t = [0u64; 256];
    let mut c = 0;
    while c < 256 {
        let mut s = 0;
        while s < 8 {
            let e: u64 = match accepts(s as u8, c as u8) {
                Some(n) => ACCEPTED | ((n as u64) << 3),
                None => {
                    let n = starts(c as u8) as u64;
                    let started = if n != 0 { STARTS } else { 0 };
                    let broke = if s != 0 { BROKE } else { 0 };
                    started | broke | (n << 3)
                }
            };
            t[c] |= e << (s * 8);
            s += 1;
        }
        c += 1;
    }
    t
}

const ACCEPTED: u64 = 1;
const STARTS: u64 = 2;
const BROKE: u64 = 4;

static STEP: [u64; 256] = steps();

/// The automaton. Bytes of a sequence are written as they come; when a byte breaks the
/// sequence, the output goes back to where it began and one U+FFFD takes its place, as
/// `from_utf8_lossy` has it. Every step does the same work whatever the byte.
fn escape_binary(b: &[u8], buf: &mut [u8]) -> usize {
    let mut pos = 0usize;
    // Where the pending sequence's output began.
    let mut seq = 0usize;
    let mut state = 0u32;
    for &c in b {
        let e = (STEP[usize::from(c)] >> state) as u32;
        state = e & 0x38;
        let accepted = (e & 1) as usize;
        let starts = ((e >> 1) & 1) as usize;
        let broke = ((e >> 2) & 1) as usize;
        // A broken sequence is taken back: its U+FFFD goes where it began.
        let m = broke.wrapping_neg();
        pos = (seq & m) | (pos & !m);
        let entry = &ENTRY[usize::from(c) | (accepted << 8) | (broke << 9)];
        buf[pos..pos + 16].copy_from_slice(entry);
        let m = starts.wrapping_neg();
        seq = ((pos + 3 * broke) & m) | (seq & !m);
        pos += usize::from(entry[15]);
    }
    if state != 0 {
        // Cut short at the end.
        pos = seq;
        buf[pos..pos + 3].copy_from_slice(&REPLACEMENT);
        pos += 3;
    }
    pos
}

/// Whether none of the eight bytes of `w` needs escaping: all in 0x20..0x80, none `"` or `\`
/// (the classic has-less-than and has-zero-byte bit tricks).
fn plain8(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let below_space = w.wrapping_sub(ONES * 0x20) & !w;
    let q = w ^ (ONES * u64::from(b'"'));
    let bs = w ^ (ONES * u64::from(b'\\'));
    let quote = q.wrapping_sub(ONES) & !q;
    let backslash = bs.wrapping_sub(ONES) & !bs;
    (below_space | quote | backslash | w) & HIGH == 0
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
            // Eight bytes at a time while they are all plain, then byte by byte.
            while let Some(word) = b.get(i..i + 8) {
                let w = u64::from_le_bytes(word.try_into().unwrap_or_default());
                if !plain8(w) {
                    break;
                }
                i += 8;
            }
            while i < b.len() && plain(b[i]) {
                i += 1;
            }
            buf[pos..pos + (i - start)].copy_from_slice(&b[start..i]);
            pos += i - start;
            continue;
        }
        let state = starts(c);
        if state == 0 {
            let entry = &ENTRY[usize::from(c)];
            buf[pos..pos + 16].copy_from_slice(entry);
            pos += usize::from(entry[15]);
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

    /// Appends `b`, escaped, to `out`.
    fn escape_lossy(b: &[u8], out: &mut Vec<u8>) {
        let mut buf = Vec::new();
        let n = escape_lossy_into(b, &mut buf);
        out.extend_from_slice(&buf[..n]);
    }

    /// What the escaped text must read as: the lossy string.
    fn expected(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    /// Both paths, whichever the input would pick.
    fn both(b: &[u8]) -> [String; 2] {
        let mut buf = vec![0; b.len() * 6 + 32];
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
        use rand::Rng;
        let mut data = vec![0u8; 200_000];
        rand::rng().fill_bytes(&mut data);
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
