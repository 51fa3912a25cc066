//! Finds the server name in a TLS ClientHello without terminating TLS. The
//! input is whatever has arrived so far; the answer is "need more", the name
//! (or its absence), or why this is not a ClientHello we will route. The
//! handshake message may be split across TLS records and records across TCP
//! segments; the caller just keeps appending bytes and asking again.

use crate::routing::names::SniHost;

pub use crate::limits::MAX_CLIENT_HELLO;

const RECORD_HEADER: usize = 5;
const CONTENT_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST: u8 = 0;
/// TLSPlaintext.length may not exceed 2^14.
const MAX_RECORD: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// More bytes are needed; nothing wrong so far.
    Incomplete,
    /// A complete ClientHello; `None` when it carries no server name.
    Complete { sni: Option<SniHost> },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    #[error("not a TLS handshake record")]
    NotTls,
    #[error("first handshake message is not a ClientHello")]
    NotClientHello,
    #[error("ClientHello of {0} bytes exceeds the limit")]
    TooLarge(usize),
    #[error("malformed ClientHello: {0}")]
    Malformed(&'static str),
}

/// Parses the ClientHello at the start of `buf`.
pub fn parse(buf: &[u8]) -> Result<Hello, HelloError> {
    parse_with_limit(buf, MAX_CLIENT_HELLO)
}

pub fn parse_with_limit(buf: &[u8], limit: usize) -> Result<Hello, HelloError> {
    // Reassemble the handshake bytes carried by consecutive handshake records.
    let mut hs: Vec<u8> = Vec::new();
    let mut rest = buf;
    let mut need: Option<usize> = None;
    loop {
        if let Some(total) = need
            && hs.len() >= total
        {
            break;
        }
        if rest.is_empty() {
            return Ok(Hello::Incomplete);
        }
        if rest[0] != CONTENT_HANDSHAKE {
            return Err(if hs.is_empty() {
                HelloError::NotTls
            } else {
                HelloError::Malformed("handshake interleaved with another record type")
            });
        }
        if rest.len() < RECORD_HEADER {
            // Check what we can of the version before waiting for more.
            if rest.len() >= 2 && rest[1] != 3 {
                return Err(HelloError::NotTls);
            }
            return Ok(Hello::Incomplete);
        }
        if rest[1] != 3 {
            return Err(HelloError::NotTls);
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 {
            return Err(HelloError::Malformed("empty handshake record"));
        }
        if len > MAX_RECORD {
            return Err(HelloError::Malformed("record longer than 2^14"));
        }
        let body = &rest[RECORD_HEADER..];
        let have = body.len().min(len);
        hs.extend_from_slice(&body[..have]);
        if need.is_none() && hs.len() >= 4 {
            if hs[0] != HANDSHAKE_CLIENT_HELLO {
                return Err(HelloError::NotClientHello);
            }
            let msg_len =
                (usize::from(hs[1]) << 16) | (usize::from(hs[2]) << 8) | usize::from(hs[3]);
            if msg_len > limit {
                return Err(HelloError::TooLarge(msg_len));
            }
            need = Some(4 + msg_len);
        } else if need.is_none() && !hs.is_empty() && hs[0] != HANDSHAKE_CLIENT_HELLO {
            return Err(HelloError::NotClientHello);
        }
        if have < len {
            return Ok(Hello::Incomplete);
        }
        rest = &body[len..];
    }
    let total = need.unwrap_or(0);
    let sni = client_hello_sni(hs.get(4..total).unwrap_or_default())?;
    Ok(Hello::Complete { sni })
}

/// The shortest buffer, beginning with `buf`, in which [`parse`] could find
/// a complete ClientHello: at least one byte more than `buf` while the
/// handshake message length is not in yet, then at least one byte per
/// handshake byte still missing. Only record headers are looked at.
///
/// A client trickling its ClientHello a byte (or a record) at a time would
/// otherwise have it re-parsed on every read: parsing only once the buffer
/// reaches this length keeps the work per connection a small multiple of
/// its bytes.
pub fn min_complete_len(buf: &[u8]) -> usize {
    let mut pos = 0;
    let mut payload = 0usize;
    let mut first = [0u8; 4];
    while let Some(header) = buf.get(pos..pos + RECORD_HEADER) {
        if header[0] != CONTENT_HANDSHAKE {
            // Not something a parse would wait on: let it say why.
            return buf.len();
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        let body = &buf[pos + RECORD_HEADER..];
        let have = body.len().min(len);
        for (i, b) in body[..have].iter().enumerate() {
            if let Some(slot) = first.get_mut(payload + i) {
                *slot = *b;
            } else {
                break;
            }
        }
        payload += have;
        if have < len || len == 0 {
            break;
        }
        pos += RECORD_HEADER + len;
    }
    if payload < 4 {
        return buf.len() + 1;
    }
    let msg_len =
        (usize::from(first[1]) << 16) | (usize::from(first[2]) << 8) | usize::from(first[3]);
    let need = 4 + msg_len;
    buf.len() + need.saturating_sub(payload)
}

/// A bounds-checked reader over the ClientHello body.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], HelloError> {
        if self.0.len() < n {
            return Err(HelloError::Malformed(what));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, HelloError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, HelloError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = usize::from(self.u8(what)?);
        self.take(n, what)
    }

    fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], HelloError> {
        let n = usize::from(self.u16(what)?);
        self.take(n, what)
    }
}

fn client_hello_sni(body: &[u8]) -> Result<Option<SniHost>, HelloError> {
    let mut r = Reader(body);
    let version = r.take(2, "version")?;
    if version[0] != 3 {
        return Err(HelloError::Malformed("legacy version"));
    }
    r.take(32, "random")?;
    let session = r.vec8("session id")?;
    if session.len() > 32 {
        return Err(HelloError::Malformed("session id longer than 32"));
    }
    let suites = r.vec16("cipher suites")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(HelloError::Malformed("cipher suites"));
    }
    if r.vec8("compression methods")?.is_empty() {
        return Err(HelloError::Malformed("compression methods"));
    }
    if r.0.is_empty() {
        // SSL 3.0-style hello without extensions.
        return Ok(None);
    }
    let mut exts = Reader(r.vec16("extensions")?);
    if !r.0.is_empty() {
        return Err(HelloError::Malformed("trailing bytes after extensions"));
    }
    let mut seen = std::collections::HashSet::new();
    let mut sni = None;
    while !exts.0.is_empty() {
        let ty = exts.u16("extension type")?;
        let data = exts.vec16("extension data")?;
        if !seen.insert(ty) {
            return Err(HelloError::Malformed("duplicate extension"));
        }
        if ty == EXT_SERVER_NAME {
            sni = server_name(data)?;
        }
    }
    Ok(sni)
}

fn server_name(data: &[u8]) -> Result<Option<SniHost>, HelloError> {
    let mut r = Reader(data);
    let mut list = Reader(r.vec16("server name list")?);
    if !r.0.is_empty() {
        return Err(HelloError::Malformed(
            "server name extension trailing bytes",
        ));
    }
    let mut host = None;
    while !list.0.is_empty() {
        let ty = list.u8("server name type")?;
        let name = list.vec16("server name")?;
        if ty == NAME_TYPE_HOST {
            if host.is_some() {
                return Err(HelloError::Malformed("two host names"));
            }
            let s = std::str::from_utf8(name).map_err(|_| HelloError::Malformed("host name"))?;
            host = Some(SniHost::new(s).map_err(|_| HelloError::Malformed("host name"))?);
        }
    }
    Ok(host)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A syntactically complete ClientHello with the given server name.
    pub(crate) fn hello(sni: Option<&str>, padding: usize) -> Vec<u8> {
        let mut exts = Vec::new();
        if let Some(name) = sni {
            let mut list = vec![NAME_TYPE_HOST];
            list.extend_from_slice(&(name.len() as u16).to_be_bytes());
            list.extend_from_slice(name.as_bytes());
            let mut data = (list.len() as u16).to_be_bytes().to_vec();
            data.extend_from_slice(&list);
            exts.extend_from_slice(&EXT_SERVER_NAME.to_be_bytes());
            exts.extend_from_slice(&(data.len() as u16).to_be_bytes());
            exts.extend_from_slice(&data);
        }
        if padding > 0 {
            exts.extend_from_slice(&21u16.to_be_bytes());
            exts.extend_from_slice(&(padding as u16).to_be_bytes());
            exts.extend(std::iter::repeat_n(0u8, padding));
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7u8; 32]);
        body.push(0);
        body.extend_from_slice(&[0, 2, 0x13, 0x01]);
        body.extend_from_slice(&[1, 0]);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut hs = vec![HANDSHAKE_CLIENT_HELLO];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        records(&hs, MAX_RECORD)
    }

    /// Wraps handshake bytes into records of at most `size` bytes each.
    pub(crate) fn records(hs: &[u8], size: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in hs.chunks(size) {
            out.extend_from_slice(&[CONTENT_HANDSHAKE, 3, 1]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    fn sni_of(buf: &[u8]) -> Option<String> {
        match parse(buf) {
            Ok(Hello::Complete { sni }) => sni.map(|s| s.to_string()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn finds_server_name() {
        assert_eq!(
            sni_of(&hello(Some("Example.COM"), 0)).as_deref(),
            Some("example.com")
        );
        assert_eq!(sni_of(&hello(None, 0)), None);
    }

    #[test]
    fn every_prefix_is_incomplete() {
        let full = hello(Some("a.example.com"), 300);
        for n in 0..full.len() {
            assert_eq!(parse(&full[..n]), Ok(Hello::Incomplete), "prefix {n}");
        }
    }

    #[test]
    fn handshake_split_across_records() {
        let one = hello(Some("split.example.com"), 100);
        let hs = one[RECORD_HEADER..].to_vec();
        for size in [1, 3, 4, 7, 50] {
            let multi = records(&hs, size);
            assert_eq!(
                sni_of(&multi).as_deref(),
                Some("split.example.com"),
                "records of {size}"
            );
            for n in 0..multi.len() {
                assert_eq!(
                    parse(&multi[..n]),
                    Ok(Hello::Incomplete),
                    "size {size} prefix {n}"
                );
            }
        }
    }

    /// The length a trickled ClientHello is next parsed at never passes the
    /// length at which it completes.
    #[test]
    fn min_complete_len_is_a_lower_bound() {
        let one = hello(Some("trickle.example.com"), 200);
        let hs = one[RECORD_HEADER..].to_vec();
        for size in [1, 2, 5, 64, MAX_RECORD] {
            let multi = records(&hs, size);
            for n in 0..multi.len() {
                let at = min_complete_len(&multi[..n]);
                assert!(at > n, "size {size} prefix {n}: {at}");
                assert!(
                    at <= multi.len(),
                    "size {size} prefix {n}: {at} > {}",
                    multi.len()
                );
            }
            assert_eq!(min_complete_len(&multi), multi.len());
            // Parsing only at those lengths takes few parses.
            let (mut at, mut parses) = (0, 0);
            while at < multi.len() {
                parses += 1;
                assert_eq!(parse(&multi[..at]), Ok(Hello::Incomplete));
                at = min_complete_len(&multi[..at]);
            }
            assert!(parses <= 80, "records of {size}: {parses} parses");
        }
    }

    #[test]
    fn rejects_what_is_not_a_client_hello() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(HelloError::NotTls));
        assert_eq!(parse(&[22, 9]), Err(HelloError::NotTls));
        assert_eq!(
            parse(&[22, 3, 1, 0, 4, 2, 0, 0, 0]),
            Err(HelloError::NotClientHello)
        );
        assert!(matches!(
            parse(&[22, 3, 1, 0, 0]),
            Err(HelloError::Malformed(_))
        ));
        let big = [22, 3, 1, 0, 4, 1, 0x01, 0, 0];
        assert_eq!(parse(&big), Err(HelloError::TooLarge(0x10000)));
        // An alert record in the middle of a fragmented ClientHello.
        let mut mixed = records(&hello(Some("x"), 0)[RECORD_HEADER..], 10)[..15].to_vec();
        mixed.extend_from_slice(&[21, 3, 3, 0, 2, 2, 40]);
        assert!(matches!(parse(&mixed), Err(HelloError::Malformed(_))));
    }

    #[test]
    fn oversize_and_truncated_inner_lengths() {
        let mut h = hello(Some("x.example"), 0);
        // Corrupt the extensions length so it runs past the message.
        let ext_len_at = RECORD_HEADER + 4 + 2 + 32 + 1 + 4 + 2;
        h[ext_len_at] = 0xff;
        assert!(matches!(parse(&h), Err(HelloError::Malformed(_))));
        assert_eq!(
            parse_with_limit(&hello(Some("x"), 5000), 4096),
            Err(HelloError::TooLarge(
                hello(Some("x"), 5000).len() - RECORD_HEADER - 4
            ))
        );
    }
}
