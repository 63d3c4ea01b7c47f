//! Splits a fuzz input into chunks for one of two sides, so one input reaches both directions
//! of a stream with arbitrary chunk boundaries: each chunk is a header of two bytes (the top
//! bit of the first picks the side, the other 15 bits the length, cut to what is left) and
//! its bytes.

pub fn chunks(mut data: &[u8]) -> impl Iterator<Item = (bool, &[u8])> {
    std::iter::from_fn(move || {
        let [a, b, rest @ ..] = data else {
            return None;
        };
        let second = a & 0x80 != 0;
        let len = (usize::from(a & 0x7f) << 8 | usize::from(*b)).min(rest.len());
        let (chunk, tail) = rest.split_at(len);
        data = tail;
        Some((second, chunk))
    })
}
