//! HPACK decoding (RFC 7541) for [`super::authority::FixAuthority`].
//!
//! Written here because no crate does it well enough for a per-dial path:
//! h2's decoder is private, and loona-hpack's Huffman decoder builds a hash
//! table for every string it decodes, which was a fifth of the server's CPU
//! per kube-apiserver dial. The Huffman code is canonical (codes follow from
//! the code lengths alone), so decoding needs only the length table below and
//! a few comparisons per bit, with no allocation but the output.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::ops::Range;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HpackError {
    #[error("header block truncated")]
    Truncated,
    #[error("integer overflow")]
    Overflow,
    #[error("invalid table index {0}")]
    Index(usize),
    #[error("table size update to {0} exceeds the limit")]
    SizeUpdate(usize),
    #[error("table size update after a header field")]
    LateSizeUpdate,
    #[error("more than two table size updates in one block")]
    TooManySizeUpdates,
    #[error("invalid Huffman padding")]
    Padding,
    #[error("EOS symbol in a Huffman string")]
    Eos,
    #[error("string longer than the header block allows")]
    TooLong,
}

/// How a field was represented in the block (RFC 7541 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr {
    /// An index into the static or dynamic table.
    Indexed,
    /// A literal added to the dynamic table.
    Incremental,
    /// A literal without indexing or never indexed.
    NotIndexed,
}

/// One decoded field and where its representation lies in the block.
pub struct Field<'a> {
    pub name: &'a [u8],
    pub value: &'a [u8],
    pub repr: Repr,
    pub span: Range<usize>,
}

impl Field<'_> {
    /// What the field counts toward SETTINGS_MAX_HEADER_LIST_SIZE (RFC 9113 §6.5.2).
    pub fn list_size(&self) -> usize {
        entry_size(self.name, self.value)
    }
}

/// A header field as the dynamic table keeps it.
type Entry = (Box<[u8]>, Box<[u8]>);
/// A literal's name and value, borrowed from the block where they can be.
type Literal<'b> = (Cow<'b, [u8]>, Cow<'b, [u8]>);

/// Decoder state for one connection: the dynamic table, never more than
/// `limit` bytes as HPACK counts them. Decoding hands each field to a
/// callback by reference: nothing a block expands to is collected.
#[derive(Debug)]
pub struct Decoder {
    /// Newest entry first, as indices count them.
    table: VecDeque<Entry>,
    size: usize,
    max_size: usize,
    /// The most `max_size` may become (our SETTINGS_HEADER_TABLE_SIZE).
    limit: usize,
}

impl Decoder {
    pub fn new(limit: usize) -> Self {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max_size: limit,
            limit,
        }
    }

    /// Decodes one complete header block, calling `field` with each field in
    /// order.
    pub fn decode(
        &mut self,
        block: &[u8],
        mut field: impl FnMut(Field<'_>),
    ) -> Result<(), HpackError> {
        let mut rd = Reader { buf: block, pos: 0 };
        let mut seen_field = false;
        let mut size_updates = 0;
        while let Some(first) = rd.peek() {
            let start = rd.pos;
            if first & 0x80 != 0 {
                let index = rd.integer(7)?;
                let (name, value) = self.get(index)?;
                field(Field {
                    name,
                    value,
                    repr: Repr::Indexed,
                    span: start..rd.pos,
                });
            } else if first & 0xc0 == 0x40 {
                let (name, value) = self.literal(&mut rd, 6)?;
                let (name, value): Entry = (name.into(), value.into());
                field(Field {
                    name: &name,
                    value: &value,
                    repr: Repr::Incremental,
                    span: start..rd.pos,
                });
                self.insert(name, value);
            } else if first & 0xe0 == 0x20 {
                if seen_field {
                    return Err(HpackError::LateSizeUpdate);
                }
                // At most two: the smallest and the final size (§4.2).
                size_updates += 1;
                if size_updates > 2 {
                    return Err(HpackError::TooManySizeUpdates);
                }
                let size = rd.integer(5)?;
                if size > self.limit {
                    return Err(HpackError::SizeUpdate(size));
                }
                self.max_size = size;
                self.evict(0);
                continue;
            } else {
                // Without indexing (0000) or never indexed (0001).
                let (name, value) = self.literal(&mut rd, 4)?;
                field(Field {
                    name: &name,
                    value: &value,
                    repr: Repr::NotIndexed,
                    span: start..rd.pos,
                });
            }
            seen_field = true;
        }
        Ok(())
    }

    fn literal<'b>(&self, rd: &mut Reader<'b>, prefix: u8) -> Result<Literal<'b>, HpackError> {
        let index = rd.integer(prefix)?;
        let name = if index == 0 {
            rd.string()?
        } else {
            Cow::Owned(self.get(index)?.0.to_vec())
        };
        Ok((name, rd.string()?))
    }

    fn get(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        match index {
            0 => Err(HpackError::Index(index)),
            i if i <= STATIC.len() => {
                let (n, v) = STATIC[i - 1];
                Ok((n.as_bytes(), v.as_bytes()))
            }
            i => self
                .table
                .get(i - STATIC.len() - 1)
                .map(|(n, v)| (&**n, &**v))
                .ok_or(HpackError::Index(index)),
        }
    }

    fn insert(&mut self, name: Box<[u8]>, value: Box<[u8]>) {
        let size = entry_size(&name, &value);
        // An entry larger than the table empties it and is not added (§4.4).
        self.evict(size);
        if size <= self.max_size {
            self.size += size;
            self.table.push_front((name, value));
        }
    }

    /// Evicts the oldest entries until `room` more bytes fit.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            match self.table.pop_back() {
                Some((n, v)) => self.size -= entry_size(&n, &v),
                None => break,
            }
        }
    }
}

/// Appends `value` as an integer with a `prefix`-bit prefix (§5.1, prefix
/// 1 to 8), the first byte's other bits set to `flags`: at most 11 bytes.
pub fn encode_integer(value: usize, prefix: u8, flags: u8, out: &mut Vec<u8>) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// An entry's size as HPACK counts it (§4.1).
pub fn entry_size(name: &[u8], value: &[u8]) -> usize {
    32 + name.len() + value.len()
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    fn byte(&mut self) -> Result<u8, HpackError> {
        let b = self.peek().ok_or(HpackError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    /// An integer with an N-bit prefix (§5.1).
    fn integer(&mut self, prefix: u8) -> Result<usize, HpackError> {
        let mask = (1u16 << prefix) as u8 - 1;
        let mut value = usize::from(self.byte()? & mask);
        if value < usize::from(mask) {
            return Ok(value);
        }
        let mut shift = 0u32;
        loop {
            let b = self.byte()?;
            // Anything past 2^28 is larger than any block or table we accept.
            if shift > 21 {
                return Err(HpackError::Overflow);
            }
            value += usize::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
    }

    /// A string literal (§5.2), Huffman-decoded if flagged: at most 8/5 of
    /// its encoded length, itself bounded by the block.
    fn string(&mut self) -> Result<Cow<'a, [u8]>, HpackError> {
        let huffman = self.peek().ok_or(HpackError::Truncated)? & 0x80 != 0;
        let len = self.integer(7)?;
        let end = self.pos.checked_add(len).ok_or(HpackError::TooLong)?;
        let raw = self.buf.get(self.pos..end).ok_or(HpackError::Truncated)?;
        self.pos = end;
        if huffman {
            huffman_decode(raw).map(Cow::Owned)
        } else {
            Ok(Cow::Borrowed(raw))
        }
    }
}

/// Canonical decoding tables derived from [`CODE_LENGTHS`] once.
struct Canonical {
    /// Per code length: the first code of that length and how many there are.
    first_code: [u32; 31],
    count: [u32; 31],
    /// Where that length's symbols start in `symbols`.
    offset: [u16; 31],
    /// Symbols ordered by (code length, symbol).
    symbols: [u16; 257],
}

fn canonical() -> &'static Canonical {
    static TABLES: std::sync::OnceLock<Canonical> = std::sync::OnceLock::new();
    TABLES.get_or_init(|| {
        let mut c = Canonical {
            first_code: [0; 31],
            count: [0; 31],
            offset: [0; 31],
            symbols: [0; 257],
        };
        for &len in CODE_LENGTHS.iter() {
            c.count[usize::from(len)] += 1;
        }
        let (mut code, mut offset) = (0u32, 0u16);
        for len in 1..31 {
            code = (code + c.count[len - 1]) << 1;
            c.first_code[len] = code;
            c.offset[len] = offset;
            offset += c.count[len] as u16;
        }
        let mut next = c.offset;
        for (symbol, &len) in CODE_LENGTHS.iter().enumerate() {
            let slot = &mut next[usize::from(len)];
            c.symbols[usize::from(*slot)] = symbol as u16;
            *slot += 1;
        }
        c
    })
}

const EOS: u16 = 256;

fn huffman_decode(src: &[u8]) -> Result<Vec<u8>, HpackError> {
    let t = canonical();
    // Huffman never shrinks a string below 5/8 of its length.
    let mut out = Vec::with_capacity(src.len() * 8 / 5 + 1);
    let (mut code, mut len) = (0u32, 0usize);
    for &byte in src {
        for bit in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> bit) & 1);
            len += 1;
            if len >= t.first_code.len() {
                return Err(HpackError::Padding);
            }
            let rel = code.wrapping_sub(t.first_code[len]);
            if code >= t.first_code[len] && rel < t.count[len] {
                let symbol = t.symbols[usize::from(t.offset[len]) + rel as usize];
                if symbol == EOS {
                    return Err(HpackError::Eos);
                }
                out.push(symbol as u8);
                code = 0;
                len = 0;
            }
        }
    }
    // What is left must be a prefix of EOS (all ones) shorter than a byte.
    if len > 7 || code != (1u32 << len) - 1 {
        return Err(HpackError::Padding);
    }
    Ok(out)
}

/// Huffman code length of each symbol, 0..=255 and EOS (RFC 7541 Appendix B).
#[rustfmt::skip]
const CODE_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6,
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10,
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5,
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28,
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
    30
];

/// The static table (RFC 7541 Appendix A).
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// An encoder for tests that indexes as grpc-go's does: whole fields found in
/// a table are referenced, everything else is added to the dynamic table
/// with Huffman-coded strings.
#[cfg(test)]
pub(crate) mod testenc {
    use super::*;

    /// Test-side Huffman encoder built from the canonical code lengths.
    pub fn huffman_encode(s: &[u8]) -> Vec<u8> {
        let t = canonical();
        let mut code_of = [(0u32, 0usize); 257];
        for len in 1..31 {
            for k in 0..t.count[len] {
                let sym = t.symbols[usize::from(t.offset[len]) + k as usize];
                code_of[usize::from(sym)] = (t.first_code[len] + k, len);
            }
        }
        let (mut acc, mut bits, mut out) = (0u64, 0usize, Vec::new());
        for &b in s {
            let (code, len) = code_of[usize::from(b)];
            acc = (acc << len) | u64::from(code);
            bits += len;
            while bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
            }
        }
        if bits > 0 {
            out.push(((acc << (8 - bits)) as u8) | (0xff >> bits));
        }
        out
    }

    pub struct IndexingEncoder {
        table: VecDeque<(Vec<u8>, Vec<u8>)>,
        size: usize,
    }

    impl IndexingEncoder {
        pub fn new() -> Self {
            IndexingEncoder {
                table: VecDeque::new(),
                size: 0,
            }
        }

        fn find(&self, name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
            let all = STATIC
                .iter()
                .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
                .chain(self.table.iter().map(|(n, v)| (&n[..], &v[..])));
            let (mut whole, mut named) = (None, None);
            for (i, (n, v)) in all.enumerate() {
                if n == name {
                    named = named.or(Some(i + 1));
                    if v == value {
                        whole = Some(i + 1);
                        break;
                    }
                }
            }
            (whole, named)
        }

        fn integer(out: &mut Vec<u8>, v: usize, prefix: u8, flags: u8) {
            super::encode_integer(v, prefix, flags, out);
        }

        fn string(out: &mut Vec<u8>, s: &[u8]) {
            let h = huffman_encode(s);
            Self::integer(out, h.len(), 7, 0x80);
            out.extend_from_slice(&h);
        }

        pub fn encode(&mut self, fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
            let mut out = Vec::new();
            for (name, value) in fields {
                match self.find(name, value) {
                    (Some(i), _) => Self::integer(&mut out, i, 7, 0x80),
                    (None, named) => {
                        Self::integer(&mut out, named.unwrap_or(0), 6, 0x40);
                        if named.is_none() {
                            Self::string(&mut out, name);
                        }
                        Self::string(&mut out, value);
                        let size = entry_size(name, value);
                        while self.size + size > 4096 {
                            match self.table.pop_back() {
                                Some((n, v)) => self.size -= entry_size(&n, &v),
                                None => break,
                            }
                        }
                        if size <= 4096 {
                            self.size += size;
                            self.table.push_front((name.clone(), value.clone()));
                        }
                    }
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testenc::huffman_encode;
    use super::*;

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    fn ours(d: &mut Decoder, block: &[u8]) -> Result<Fields, HpackError> {
        let mut out = Vec::new();
        d.decode(block, |f| out.push((f.name.to_vec(), f.value.to_vec())))?;
        Ok(out)
    }

    /// xorshift: repeatable pseudo-random input without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    fn string_literal(out: &mut Vec<u8>, s: &[u8], huffman: bool) {
        let (flag, body) = if huffman {
            (0x80, huffman_encode(s))
        } else {
            (0, s.to_vec())
        };
        let start = out.len();
        let _ = loona_hpack::encoder::encode_integer_into(body.len(), 7, 0, out);
        out[start] |= flag;
        out.extend_from_slice(&body);
    }

    #[test]
    fn canonical_codes_match_the_rfc_examples() {
        // RFC 7541 C.4.1: "www.example.com", and the lengths it relies on.
        assert_eq!(
            huffman_encode(b"www.example.com"),
            [
                0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff
            ]
        );
        assert_eq!(
            huffman_decode(&[0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf]).as_deref(),
            Ok(&b"no-cache"[..])
        );
    }

    /// Our integer encoder writes what loona's does, and our decoder reads
    /// it back, for every prefix and values around each length step.
    #[test]
    fn integers_encode_like_loona_and_round_trip() {
        for prefix in 1..=8u8 {
            let max = (1usize << prefix) - 1;
            let mut values = vec![0, 1, max - 1, max, max + 1, 1 << 28, usize::MAX >> 40];
            for k in 1..5 {
                values.extend([max + (1 << (7 * k)) - 1, max + (1 << (7 * k))]);
            }
            for v in values {
                let (mut ours, mut loona) = (Vec::new(), Vec::new());
                super::encode_integer(v, prefix, 0, &mut ours);
                let _ = loona_hpack::encoder::encode_integer_into(v, prefix, 0, &mut loona);
                assert_eq!(ours, loona, "value {v}, prefix {prefix}");
                let mut rd = super::Reader { buf: &ours, pos: 0 };
                // HPACK's prefixes are 4 to 7 bits; the decoder reads those.
                if prefix < 8 && v <= 1 << 28 {
                    assert_eq!(rd.integer(prefix), Ok(v), "value {v}, prefix {prefix}");
                    assert_eq!(rd.pos, ours.len());
                }
            }
        }
        // The prefix's other bits are kept.
        let mut out = Vec::new();
        super::encode_integer(3, 6, 0x40, &mut out);
        assert_eq!(out, [0x43]);
    }

    #[test]
    fn huffman_round_trips_and_agrees_with_loona() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for n in 0..400 {
            let s = rng.bytes(n % 64);
            let enc = huffman_encode(&s);
            assert_eq!(huffman_decode(&enc).as_deref(), Ok(&s[..]), "input {s:?}");
            let loona = loona_hpack::huffman::HuffmanDecoder::new().decode(&enc);
            assert_eq!(loona.ok().as_deref(), Some(&s[..]));
        }
        // Arbitrary bytes: both decoders accept or refuse alike.
        for n in 0..2000 {
            let junk = rng.bytes(n % 12);
            let loona = loona_hpack::huffman::HuffmanDecoder::new().decode(&junk);
            assert_eq!(huffman_decode(&junk).ok(), loona.ok(), "input {junk:?}");
        }
    }

    #[test]
    fn huffman_padding_and_eos_are_refused() {
        // 8 one-bits of padding: longer than 7 bits.
        let mut s = huffman_encode(b"a");
        s.push(0xff);
        assert_eq!(huffman_decode(&s), Err(HpackError::Padding));
        // Padding of zeros instead of the EOS prefix: '0' is 00000, padded with 000.
        assert_eq!(huffman_decode(&[0x00]), Err(HpackError::Padding));
        // EOS itself: 30 one-bits.
        assert_eq!(
            huffman_decode(&[0xff, 0xff, 0xff, 0xfc]),
            Err(HpackError::Eos)
        );
    }

    #[test]
    fn blocks_from_an_indexing_encoder_decode_like_loona() {
        let mut rng = Rng(42);
        let mut enc = loona_hpack::Encoder::new();
        let mut reference = loona_hpack::Decoder::new();
        let mut d = Decoder::new(4096);
        let names: [&[u8]; 6] = [
            b":authority",
            b":path",
            b"user-agent",
            b"content-type",
            b"x-custom",
            b"grpc-timeout",
        ];
        for round in 0..300 {
            let fields: Vec<(Vec<u8>, Vec<u8>)> = (0..1 + round % 7)
                .map(|_| {
                    let name = names[(rng.next() % 6) as usize].to_vec();
                    // Few distinct values so the dynamic table is reused; long
                    // ones now and then so it evicts.
                    let len = if rng.next().is_multiple_of(10) {
                        900
                    } else {
                        8
                    };
                    let value = format!("{:0len$}", rng.next() % 5).into_bytes();
                    (name, value)
                })
                .collect();
            let block = enc.encode(fields.iter().map(|(n, v)| (&n[..], &v[..])));
            let want = reference.decode(&block).map_err(|e| format!("{e:?}"));
            assert_eq!(want.as_ref(), Ok(&fields));
            assert_eq!(ours(&mut d, &block), Ok(fields));
        }
    }

    #[test]
    fn literal_forms_with_huffman_and_the_static_table() {
        let mut d = Decoder::new(4096);
        let mut block = vec![0x82]; // :method GET
        block.push(0x41); // :authority, incremental indexing, name index 1
        string_literal(&mut block, b"%2Fetc%2Fsock", true);
        block.push(0x10); // never indexed, new name
        string_literal(&mut block, b"x-secret", false);
        string_literal(&mut block, b"s3cr3t", true);
        block.push(0x0f); // without indexing, name index 58 (user-agent)
        block.push(58 - 15);
        string_literal(&mut block, b"grpc-go/1.72", false);
        block.push(0x80 | 62); // the entry inserted above
        let got = ours(&mut d, &block);
        let want: Fields = [
            (":method", "GET"),
            (":authority", "%2Fetc%2Fsock"),
            ("x-secret", "s3cr3t"),
            ("user-agent", "grpc-go/1.72"),
            (":authority", "%2Fetc%2Fsock"),
        ]
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
        assert_eq!(got, Ok(want));
    }

    #[test]
    fn bad_blocks_are_errors() {
        let cases: [(&[u8], HpackError); 7] = [
            (&[0x80], HpackError::Index(0)),
            (&[0x80 | 62], HpackError::Index(62)),
            (&[0x41, 0x05, b'a'], HpackError::Truncated),
            (&[0x3f, 0xe2, 0x1f], HpackError::SizeUpdate(4097)),
            (&[0x82, 0x20], HpackError::LateSizeUpdate),
            (&[0xff, 0xff, 0xff, 0xff, 0xff, 0x7f], HpackError::Overflow),
            (&[0x41, 0x81, 0x00], HpackError::Padding),
        ];
        for (block, want) in cases {
            assert_eq!(
                Decoder::new(4096).decode(block, |_| {}),
                Err(want),
                "{block:x?}"
            );
        }
    }

    #[test]
    fn size_update_to_zero_empties_the_table() {
        let mut d = Decoder::new(4096);
        let mut block = vec![0x40];
        string_literal(&mut block, b"k", false);
        string_literal(&mut block, b"v", false);
        assert!(ours(&mut d, &block).is_ok());
        assert_eq!(ours(&mut d, &[0x80 | 62]).map(|f| f.len()), Ok(1));
        assert_eq!(ours(&mut d, &[0x20, 0x80 | 62]), Err(HpackError::Index(62)));
    }

    #[test]
    fn garbage_never_panics_and_agrees_with_loona_on_success() {
        let mut rng = Rng(7);
        for n in 0..5000 {
            let junk = rng.bytes(n % 40);
            let mut reference = loona_hpack::Decoder::new();
            reference.set_max_allowed_table_size(4096);
            let want = reference.decode(&junk);
            let got = ours(&mut Decoder::new(4096), &junk);
            if let (Ok(want), Ok(got)) = (&want, &got) {
                assert_eq!(want, got, "input {junk:x?}");
            }
        }
    }
}
