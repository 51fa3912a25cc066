//! Reading a client's first bytes (its ClientHello or request head) without
//! holding a buffer while the client is silent: a listener full of half-open
//! connections then costs their sockets and small tasks, not a read buffer
//! each. What has arrived is kept in a buffer of its own size.

use std::io;

use tokio::net::TcpStream;

/// Stack space one read goes through; not held across an await.
const SCRATCH: usize = 4096;

/// Waits until `io` has bytes, then appends at most `max - buf.len()` of them
/// to `buf`. Returns how many (0: the client closed).
pub async fn read_some(io: &TcpStream, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    loop {
        io.readable().await?;
        let mut scratch = [0u8; SCRATCH];
        let want = max.saturating_sub(buf.len()).clamp(1, SCRATCH);
        match io.try_read(&mut scratch[..want]) {
            Ok(n) => {
                buf.extend_from_slice(&scratch[..n]);
                return Ok(n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Reads and drops up to `max` bytes or until the client closes, whichever
/// comes first; for letting a refused client finish sending before the close.
pub async fn discard(io: &TcpStream, mut max: usize) {
    while max > 0 {
        if io.readable().await.is_err() {
            return;
        }
        let mut scratch = [0u8; SCRATCH];
        match io.try_read(&mut scratch[..max.min(SCRATCH)]) {
            Ok(0) => return,
            Ok(n) => max -= n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn appends_what_arrives_up_to_the_bound() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let mut c = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (s, _) = l.accept().await.unwrap_or_else(|e| panic!("{e}"));
        c.write_all(b"hello world")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut buf = Vec::new();
        while buf.len() < 5 {
            read_some(&s, &mut buf, 5)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(buf, b"hello");
        assert!(buf.capacity() < 64, "{}", buf.capacity());
        drop(c);
        let mut rest = Vec::new();
        while read_some(&s, &mut rest, 100)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            > 0
        {}
        assert_eq!(rest, b" world");
    }
}
