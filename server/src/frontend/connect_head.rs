//! The HTTP CONNECT frontend's request head, read as upstream's Go
//! `net/http` server reads it, and the answers that server writes for a head
//! it refuses, byte for byte (docs/konnectivity.md, "Edge statuses").
//!
//! httparse splits the head; what Go then does with it — which target is
//! dialed, which request is refused with which status — is repeated here
//! because kube-apiserver and operators see those bytes. Go dials whatever
//! CONNECT names (a target without a port fails in the agent, 502), so the
//! target is checked only as far as Go's URL parser checks it.

use crate::limits::{MAX_CONNECT_HEAD as MAX_HEAD, MAX_CONNECT_HEADERS};

/// The host the agent is asked to dial: a CONNECT target or, for a target
/// that is a path, the Host header, as Go's `Request.Host` is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectAuthority(pub String);

/// A parsed request head.
#[derive(Debug, PartialEq, Eq)]
pub enum Head {
    Connect {
        authority: ConnectAuthority,
        user_agent: String,
        /// A valid W3C `traceparent` header, if one was sent.
        traceparent: Option<crate::traceparent::TraceParent>,
    },
    /// Any other method: Go's handler answers 405.
    OtherMethod {
        method: String,
        /// The client asked for the connection to end after the answer
        /// (HTTP/1.0, or `Connection: close`); `close_header`: answer with
        /// `Connection: close` (HTTP/1.1 asking so).
        close: bool,
        close_header: bool,
        /// A body follows (Content-Length or a transfer coding): the
        /// connection is closed after the answer rather than read past it.
        has_body: bool,
    },
}

/// A refused head; each has Go's exact answer ([`HeadError::response`]).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeadError {
    /// Go's plain `400 Bad Request` (a request line, header or target its
    /// parser rejects).
    #[error("malformed request: {0}")]
    Malformed(String),
    /// Go's `400 Bad Request: <text>`.
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    #[error("unsupported protocol version")]
    Version,
    #[error("unsupported transfer encoding")]
    TransferEncoding,
    #[error(
        "request head larger than {MAX_HEAD} bytes or with more than {MAX_CONNECT_HEADERS} fields"
    )]
    TooLarge,
}

const ERROR_HEADERS: &str =
    "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n";

impl HeadError {
    /// What Go's server writes before it closes the connection.
    pub fn response(&self) -> Vec<u8> {
        let text = match self {
            HeadError::Malformed(_) => "400 Bad Request".to_string(),
            HeadError::BadRequest(why) => format!("400 Bad Request: {why}"),
            HeadError::Version => {
                "505 HTTP Version Not Supported: unsupported protocol version".into()
            }
            HeadError::TransferEncoding => {
                return format!(
                    "HTTP/1.1 501 Not Implemented{ERROR_HEADERS}Unsupported transfer encoding"
                )
                .into_bytes();
            }
            HeadError::TooLarge => "431 Request Header Fields Too Large".into(),
        };
        format!("HTTP/1.1 {text}{ERROR_HEADERS}{text}").into_bytes()
    }
}

/// The answer Go's `http.Error` writes from upstream's handler for a
/// method other than CONNECT; the connection then stays open unless the
/// client asked otherwise.
pub fn method_not_allowed(close_header: bool) -> Vec<u8> {
    const BODY: &str = "this proxy only supports CONNECT passthrough\n";
    let close = if close_header {
        "Connection: close\r\n"
    } else {
        ""
    };
    format!(
        "HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nDate: {}\r\nContent-Length: {}\r\n{close}\r\n{BODY}",
        httpdate::fmt_http_date(std::time::SystemTime::now()),
        BODY.len()
    )
    .into_bytes()
}

/// Go's `httpguts.ValidHostHeader`.
fn valid_host_header(h: &[u8]) -> bool {
    h.iter().all(|b| {
        b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'!' | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b'-'
                    | b'.'
                    | b':'
                    | b';'
                    | b'='
                    | b'['
                    | b']'
                    | b'_'
                    | b'~'
            )
    })
}

/// The host of a CONNECT target in authority form, as Go's `url.Parse` of
/// `http://<target>` gives it; `None` where that parse fails.
fn authority_host(target: &str) -> Option<&str> {
    let end = target.find(['/', '?']).unwrap_or(target.len());
    let authority = &target[..end];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.bytes().any(|b| b < 0x21 || b == 0x7f) {
        return None;
    }
    let port = if let Some(rest) = host.strip_prefix('[') {
        // An IP-literal: an IPv6 address (a zone after "%25"), then the port.
        let close = rest.rfind(']')?;
        let literal = &rest[..close];
        let addr = literal.split_once("%25").map_or(literal, |(a, _)| a);
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return None;
        }
        &rest[close + 1..]
    } else {
        // Go refuses '[' inside a host and, for http URLs, more than one ':'.
        if host.contains('[') || host.matches(':').count() > 1 {
            return None;
        }
        host.rfind(':').map_or("", |i| &host[i..])
    };
    // validOptionalPort: nothing, or ':' and digits only.
    let port_ok = port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()));
    port_ok.then_some(host)
}

/// A request target Go's `url.ParseRequestURI` takes for a method other
/// than CONNECT: a path, `*`, or an absolute URL.
fn valid_request_uri(target: &str) -> bool {
    if target.starts_with('/') || target == "*" {
        return true;
    }
    let scheme_end = target.find(':').unwrap_or(0);
    let scheme = &target[..scheme_end];
    scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// The version from the request line, for a head httparse refused over it:
/// Go reads any `HTTP/<major>.<minor>` and refuses majors other than 1 with
/// 505.
fn refused_version(buf: &[u8]) -> HeadError {
    let line_end = buf.iter().position(|b| *b == b'\n').unwrap_or(buf.len());
    let line = String::from_utf8_lossy(&buf[..line_end]);
    let version = line.trim_end_matches('\r').rsplit(' ').next().unwrap_or("");
    let parsed = version.strip_prefix("HTTP/").and_then(|v| {
        let (major, minor) = v.split_once('.')?;
        let digits =
            |s: &str| !s.is_empty() && s.len() <= 3 && s.bytes().all(|b| b.is_ascii_digit());
        (digits(major) && digits(minor)).then(|| major.parse::<u32>().unwrap_or(0))
    });
    match parsed {
        Some(major) if major != 1 => HeadError::Version,
        _ => HeadError::Malformed(format!("malformed HTTP version {version:?}")),
    }
}

/// Parses a request head from `buf`. `Ok(None)`: need more bytes.
/// On success also returns the head's length.
pub fn parse_head(buf: &[u8]) -> Result<Option<(Head, usize)>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_CONNECT_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => return Err(HeadError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(httparse::Error::Version) => return Err(refused_version(buf)),
        Err(e) => return Err(HeadError::Malformed(e.to_string())),
    };
    let method = req.method.unwrap_or_default();
    let target = req.path.unwrap_or_default();
    let header = |name: &'static str| {
        req.headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    let connect = method == "CONNECT";
    // Go's readRequest, in its order: the target, then the headers.
    let target_host =
        if connect && !target.starts_with('/') {
            Some(authority_host(target).ok_or_else(|| {
                HeadError::Malformed(format!("invalid CONNECT target {target:?}"))
            })?)
        } else if valid_request_uri(target) {
            None
        } else {
            return Err(HeadError::Malformed(format!(
                "invalid request URI {target:?}"
            )));
        };
    let hosts: Vec<&[u8]> = header("host").collect();
    if hosts.len() > 1 {
        return Err(HeadError::Malformed("too many Host headers".into()));
    }
    let mut transfer_encodings = header("transfer-encoding");
    let chunked = match (transfer_encodings.next(), transfer_encodings.next()) {
        (None, _) => false,
        (Some(te), None) if te.eq_ignore_ascii_case(b"chunked") => true,
        _ => return Err(HeadError::TransferEncoding),
    };
    let http11 = req.version == Some(1);
    if http11 && hosts.is_empty() && !connect {
        return Err(HeadError::BadRequest("missing required Host header"));
    }
    if hosts.first().is_some_and(|h| !valid_host_header(h)) {
        return Err(HeadError::BadRequest("malformed Host header"));
    }
    if !connect {
        let close_asked = header("connection").any(|v| {
            String::from_utf8_lossy(v)
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("close"))
        });
        let has_body =
            chunked || header("content-length").any(|v| v.iter().any(|b| *b != b'0' && *b != b' '));
        return Ok(Some((
            Head::OtherMethod {
                method: method.to_string(),
                close: close_asked || !http11,
                close_header: close_asked && http11,
                has_body,
            },
            len,
        )));
    }
    let host = match target_host {
        Some(h) => h.to_string(),
        None => hosts
            .first()
            .map(|h| String::from_utf8_lossy(h).into_owned())
            .unwrap_or_default(),
    };
    let user_agent = header("user-agent")
        .next()
        .and_then(|v| std::str::from_utf8(v).ok())
        .unwrap_or_default()
        .to_string();
    let traceparent = header("traceparent")
        .next()
        .and_then(crate::traceparent::TraceParent::parse);
    Ok(Some((
        Head::Connect {
            authority: ConnectAuthority(host),
            user_agent,
            traceparent,
        },
        len,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect_host(req: &[u8]) -> Result<String, HeadError> {
        match parse_head(req)? {
            Some((Head::Connect { authority, .. }, _)) => Ok(authority.0),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parses_what_kube_apiserver_sends() {
        let req =
            b"CONNECT 10.0.0.5:10250 HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: kube\r\n\r\nEXTRA";
        let (head, len) = parse_head(req).ok().flatten().unwrap_or((
            Head::Connect {
                authority: ConnectAuthority(String::new()),
                user_agent: String::new(),
                traceparent: None,
            },
            0,
        ));
        assert_eq!(
            head,
            Head::Connect {
                authority: ConnectAuthority("10.0.0.5:10250".into()),
                user_agent: "kube".into(),
                traceparent: None,
            }
        );
        assert_eq!(&req[len..], b"EXTRA");
    }

    #[test]
    fn targets_go_dials_are_passed_to_the_agent() {
        // The agent's dial refuses these, as upstream's does (502).
        assert_eq!(
            connect_host(b"CONNECT 10.0.0.1 HTTP/1.1\r\n\r\n"),
            Ok("10.0.0.1".into())
        );
        assert_eq!(
            connect_host(b"CONNECT a:99999 HTTP/1.1\r\n\r\n"),
            Ok("a:99999".into())
        );
        assert_eq!(
            connect_host(b"CONNECT [::1]:80 HTTP/1.1\r\n\r\n"),
            Ok("[::1]:80".into())
        );
        assert_eq!(
            connect_host(b"CONNECT [::1] HTTP/1.1\r\n\r\n"),
            Ok("[::1]".into())
        );
        // A path: Go's Request.Host is the Host header.
        assert_eq!(
            connect_host(b"CONNECT /x HTTP/1.1\r\nHost: h:1\r\n\r\n"),
            Ok("h:1".into())
        );
        assert_eq!(
            connect_host(b"CONNECT /x HTTP/1.1\r\n\r\n"),
            Ok(String::new())
        );
        assert_eq!(
            connect_host(b"CONNECT u@h:1/p HTTP/1.1\r\n\r\n"),
            Ok("h:1".into())
        );
    }

    #[test]
    fn refused_heads_get_gos_answers() {
        let answer = |req: &[u8]| match parse_head(req) {
            Err(e) => String::from_utf8_lossy(&e.response()).into_owned(),
            Ok(h) => format!("parsed: {h:?}"),
        };
        assert_eq!(
            answer(b"CONNECT a:-1 HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"
        );
        assert_eq!(
            answer(b"CONNECT a:1 HTTP/2.0\r\n\r\n"),
            "HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n505 HTTP Version Not Supported: unsupported protocol version"
        );
        assert_eq!(
            answer(b"CONNECT a:1 HTTP/1.1\r\nHost: a b\r\n\r\n"),
            "HTTP/1.1 400 Bad Request: malformed Host header\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: malformed Host header"
        );
        assert_eq!(
            answer(b"CONNECT a:1 HTTP/1.1\r\nTransfer-Encoding: foo\r\n\r\n"),
            "HTTP/1.1 501 Not Implemented\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nUnsupported transfer encoding"
        );
        assert_eq!(
            answer(b"GET / HTTP/1.1\r\n\r\n"),
            "HTTP/1.1 400 Bad Request: missing required Host header\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: missing required Host header"
        );
        assert!(
            answer(b"connect 127.0.0.1:1 HTTP/1.1\r\nHost: h\r\n\r\n")
                .starts_with("HTTP/1.1 400 Bad Request\r\n")
        );
        assert!(answer(b"\x16\x03\x01garbage\r\n\r\n").starts_with("HTTP/1.1 400 Bad Request\r\n"));
        // Go's URL parser: no unbracketed IPv6, only IPv6 in brackets.
        for bad in ["::1:80", "[127.0.0.1]:80", "a[b]:1", "[::1:80"] {
            let req = format!("CONNECT {bad} HTTP/1.1\r\n\r\n");
            assert!(
                answer(req.as_bytes()).starts_with("HTTP/1.1 400 Bad Request\r\n"),
                "{bad}"
            );
        }
        let huge = [
            b"CONNECT a:1 HTTP/1.1\r\nX: ".as_slice(),
            &vec![b'a'; MAX_HEAD + 1],
        ]
        .concat();
        assert_eq!(parse_head(&huge), Err(HeadError::TooLarge));
        assert!(answer(&huge).starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert_eq!(parse_head(b"CONNECT a:1 HTTP/1.1\r\nHo"), Ok(None));
    }

    #[test]
    fn other_methods_keep_the_connection_as_go_does() {
        let other = |req: &[u8]| match parse_head(req) {
            Ok(Some((
                Head::OtherMethod {
                    close,
                    close_header,
                    has_body,
                    ..
                },
                _,
            ))) => (close, close_header, has_body),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            other(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"),
            (false, false, false)
        );
        assert_eq!(
            other(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"),
            (true, true, false)
        );
        assert_eq!(other(b"GET / HTTP/1.0\r\n\r\n"), (true, false, false));
        assert_eq!(
            other(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n"),
            (false, false, true)
        );
        let r = String::from_utf8_lossy(&method_not_allowed(false)).into_owned();
        assert!(r.starts_with("HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nDate: "), "{r}");
        assert!(
            r.ends_with(
                " GMT\r\nContent-Length: 45\r\n\r\nthis proxy only supports CONNECT passthrough\n"
            ),
            "{r}"
        );
    }
}
