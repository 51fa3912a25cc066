mod error;
mod framed_read;
mod framed_write;

pub use self::error::{SendError, UserError};

use self::framed_read::FramedRead;
use self::framed_write::FramedWrite;

use crate::frame::{self, Data, Frame};
use crate::proto::Error;

use bytes::Buf;
use futures_core::Stream;
use futures_sink::Sink;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::length_delimited;

use std::io;

#[derive(Debug)]
pub struct Codec<T, B> {
    inner: FramedRead<FramedWrite<T, B>>,
}

impl<T, B> Codec<T, B>
where
    T: AsyncRead + AsyncWrite + Unpin,
    B: Buf,
{
    /// Returns a new `Codec` with the default max frame size
    #[inline]
    pub fn new(io: T) -> Self {
        Self::with_max_recv_frame_size(io, frame::DEFAULT_MAX_FRAME_SIZE as usize)
    }

    /// Returns a new `Codec` with the given maximum frame size
    pub fn with_max_recv_frame_size(io: T, max_frame_size: usize) -> Self {
        // Wrap with writer
        let framed_write = FramedWrite::new(io);

        // Delimit the frames
        let delimiter = length_delimited::Builder::new()
            .big_endian()
            .length_field_length(3)
            .length_adjustment(9)
            .num_skip(0) // Don't skip the header
            .new_codec();

        let mut inner = FramedRead::new(framed_write, delimiter);

        // Use FramedRead's method since it checks the value is within range.
        inner.set_max_frame_size(max_frame_size);

        Codec { inner }
    }
}

impl<T, B> Codec<T, B> {
    /// Updates the max received frame size.
    ///
    /// The change takes effect the next time a frame is decoded. In other
    /// words, if a frame is currently in process of being decoded with a frame
    /// size greater than `val` but less than the max frame size in effect
    /// before calling this function, then the frame will be allowed.
    #[inline]
    pub fn set_max_recv_frame_size(&mut self, val: usize) {
        self.inner.set_max_frame_size(val)
    }

    /// Returns the current max received frame size setting.
    ///
    /// This is the largest size this codec will accept from the wire. Larger
    /// frames will be rejected.
    #[cfg(feature = "unstable")]
    #[inline]
    pub fn max_recv_frame_size(&self) -> usize {
        self.inner.max_frame_size()
    }

    /// Returns the max frame size that can be sent to the peer.
    pub fn max_send_frame_size(&self) -> usize {
        self.inner.get_ref().max_frame_size()
    }

    /// Set the peer's max frame size.
    pub fn set_max_send_frame_size(&mut self, val: usize) {
        self.framed_write().set_max_frame_size(val)
    }

    /// Set the peer's header table size size.
    pub fn set_send_header_table_size(&mut self, val: usize) {
        self.framed_write().set_header_table_size(val)
    }

    /// Set the decoder header table size size.
    pub fn set_recv_header_table_size(&mut self, val: usize) {
        self.inner.set_header_table_size(val)
    }

    /// Set the max header list size that can be received.
    pub fn set_max_recv_header_list_size(&mut self, val: usize) {
        self.inner.set_max_header_list_size(val);
    }

    /// Get a reference to the inner stream.
    #[cfg(feature = "unstable")]
    pub fn get_ref(&self) -> &T {
        self.inner.get_ref().get_ref()
    }

    /// Get a mutable reference to the inner stream.
    pub fn get_mut(&mut self) -> &mut T {
        self.inner.get_mut().get_mut()
    }

    /// Takes the data payload value that was fully written to the socket
    pub(crate) fn take_last_data_frame(&mut self) -> Option<Data<B>> {
        self.framed_write().take_last_data_frame()
    }

    fn framed_write(&mut self) -> &mut FramedWrite<T, B> {
        self.inner.get_mut()
    }
}

impl<T, B> Codec<T, B>
where
    T: AsyncWrite + Unpin,
    B: Buf,
{
    /// Returns `Ready` when the codec can buffer a frame
    pub fn poll_ready(&mut self, cx: &mut Context) -> Poll<io::Result<()>> {
        self.framed_write().poll_ready(cx)
    }

    /// Returns whether the codec can buffer a frame without flushing the
    /// underlying I/O object.
    pub(crate) fn has_send_capacity(&mut self) -> bool {
        self.framed_write().has_capacity()
    }

    /// Buffer a frame.
    ///
    /// `poll_ready` must be called first to ensure that a frame may be
    /// accepted.
    ///
    /// TODO: Rename this to avoid conflicts with Sink::buffer
    pub fn buffer(&mut self, item: Frame<B>) -> Result<(), UserError> {
        self.framed_write().buffer(item)
    }

    /// Flush buffered data to the wire
    pub fn flush(&mut self, cx: &mut Context) -> Poll<io::Result<()>> {
        self.framed_write().flush(cx)
    }

    /// Frees the write buffer if it holds nothing still to be written.
    pub fn release_idle_write_buffer(&mut self) {
        self.framed_write().release_idle_buffer()
    }

    /// Shutdown the send half
    pub fn shutdown(&mut self, cx: &mut Context) -> Poll<io::Result<()>> {
        self.framed_write().shutdown(cx)
    }
}

impl<T, B> Stream for Codec<T, B>
where
    T: AsyncRead + Unpin,
{
    type Item = Result<Frame, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

impl<T, B> Sink<Frame<B>> for Codec<T, B>
where
    T: AsyncWrite + Unpin,
    B: Buf,
{
    type Error = SendError;

    fn start_send(mut self: Pin<&mut Self>, item: Frame<B>) -> Result<(), Self::Error> {
        Codec::buffer(&mut self, item)?;
        Ok(())
    }
    /// Returns `Ready` when the codec can buffer a frame
    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.framed_write().poll_ready(cx).map_err(Into::into)
    }

    /// Flush buffered data to the wire
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.framed_write().flush(cx).map_err(Into::into)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        ready!(self.shutdown(cx))?;
        Poll::Ready(Ok(()))
    }
}

// TODO: remove (or improve) this
impl<T> From<T> for Codec<T, bytes::Bytes>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    fn from(src: T) -> Self {
        Self::new(src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{Ping, StreamId};

    use bytes::{Bytes, BytesMut};
    use std::collections::VecDeque;
    use std::sync::Arc;
    use std::task::{Wake, Waker};
    use tokio::io::ReadBuf;

    /// An I/O object whose reads return the chunks queued, then `Pending`
    /// (EOF once `eof` is set), and whose writes take up to `write_room`
    /// bytes, then return `Pending`.
    #[derive(Default)]
    struct Mock {
        reads: VecDeque<Vec<u8>>,
        eof: bool,
        read_calls: usize,
        written: Vec<u8>,
        write_room: usize,
    }

    impl AsyncRead for Mock {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            self.read_calls += 1;
            match self.reads.pop_front() {
                Some(mut chunk) => {
                    let n = chunk.len().min(buf.remaining());
                    buf.put_slice(&chunk[..n]);
                    if n < chunk.len() {
                        chunk.drain(..n);
                        self.reads.push_front(chunk);
                    }
                    Poll::Ready(Ok(()))
                }
                None if self.eof => Poll::Ready(Ok(())),
                None => Poll::Pending,
            }
        }
    }

    impl AsyncWrite for Mock {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            src: &[u8],
        ) -> Poll<io::Result<usize>> {
            let n = src.len().min(self.write_room);
            if n == 0 {
                return Poll::Pending;
            }
            self.write_room -= n;
            self.written.extend_from_slice(&src[..n]);
            Poll::Ready(Ok(n))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    struct NoopWake;

    impl Wake for NoopWake {
        fn wake(self: Arc<Self>) {}
    }

    fn waker() -> Waker {
        Arc::new(NoopWake).into()
    }

    fn codec(reads: Vec<Vec<u8>>) -> Codec<Mock, Bytes> {
        Codec::new(Mock {
            reads: reads.into(),
            write_room: usize::MAX,
            ..Mock::default()
        })
    }

    fn ping_bytes(payload: u8) -> Vec<u8> {
        let mut buf = BytesMut::new();
        Ping::new([payload; 8]).encode(&mut buf);
        buf.to_vec()
    }

    fn poll_frame(codec: &mut Codec<Mock, Bytes>) -> Poll<Option<Result<Frame, Error>>> {
        let waker = waker();
        Pin::new(codec).poll_next(&mut Context::from_waker(&waker))
    }

    fn expect_ping(codec: &mut Codec<Mock, Bytes>, payload: u8) {
        match poll_frame(codec) {
            Poll::Ready(Some(Ok(Frame::Ping(ping)))) => assert_eq!(ping.payload(), &[payload; 8]),
            other => panic!("expected PING {}, got {:?}", payload, other),
        }
    }

    fn read_capacity(codec: &Codec<Mock, Bytes>) -> usize {
        codec.inner.buffer_capacity()
    }

    fn write_capacity(codec: &mut Codec<Mock, Bytes>) -> usize {
        codec.framed_write().buffer_capacity()
    }

    #[test]
    fn a_new_connection_holds_no_buffers() {
        let mut codec = codec(vec![]);
        assert_eq!(read_capacity(&codec), 0);
        assert_eq!(write_capacity(&mut codec), 0);
        assert_eq!(codec.inner.hpack_buffer_capacity(), 0);
        // Waiting for the peer allocates nothing either.
        assert!(poll_frame(&mut codec).is_pending());
        assert_eq!(read_capacity(&codec), 0);
    }

    #[test]
    fn the_read_buffer_is_freed_once_everything_read_is_decoded() {
        let mut codec = codec(vec![ping_bytes(1)]);
        expect_ping(&mut codec, 1);
        assert!(poll_frame(&mut codec).is_pending());
        assert_eq!(read_capacity(&codec), 0);
        // And allocated again when the peer sends more.
        codec.get_mut().reads.push_back(ping_bytes(2));
        expect_ping(&mut codec, 2);
    }

    #[test]
    fn frames_that_arrive_together_are_decoded_without_another_read() {
        let mut bytes = ping_bytes(1);
        bytes.extend(ping_bytes(2));
        bytes.extend(ping_bytes(3));
        let mut codec = codec(vec![bytes]);
        for payload in 1..=3 {
            expect_ping(&mut codec, payload);
        }
        assert_eq!(codec.get_mut().read_calls, 1);
        assert!(poll_frame(&mut codec).is_pending());
    }

    #[test]
    fn a_partial_frame_is_kept_while_waiting_for_the_rest() {
        let bytes = ping_bytes(7);
        let mut codec = codec(vec![bytes[..4].to_vec()]);
        assert!(poll_frame(&mut codec).is_pending());
        assert!(read_capacity(&codec) >= 4);
        codec.get_mut().reads.push_back(bytes[4..].to_vec());
        expect_ping(&mut codec, 7);
    }

    #[test]
    fn a_frame_larger_than_the_first_read_is_read_whole() {
        let mut bytes = BytesMut::new();
        let payload = vec![0xab; frame::DEFAULT_MAX_FRAME_SIZE as usize];
        frame::Data::new(StreamId::from(1), Bytes::from(payload.clone())).encode_chunk(&mut bytes);
        let bytes = bytes.to_vec();
        let mut codec = codec(vec![
            bytes[..10_000].to_vec(),
            bytes[10_000..13_000].to_vec(),
            bytes[13_000..].to_vec(),
        ]);
        match poll_frame(&mut codec) {
            Poll::Ready(Some(Ok(Frame::Data(data)))) => assert_eq!(data.payload()[..], payload[..]),
            other => panic!("expected DATA, got {:?}", other),
        }
        assert!(poll_frame(&mut codec).is_pending());
        assert_eq!(read_capacity(&codec), 0);
    }

    #[test]
    fn eof_between_frames_ends_the_stream_and_eof_inside_one_is_an_error() {
        let mut codec = codec(vec![ping_bytes(1)]);
        codec.get_mut().eof = true;
        expect_ping(&mut codec, 1);
        assert!(matches!(poll_frame(&mut codec), Poll::Ready(None)));

        let bytes = ping_bytes(2);
        let mut codec = self::codec(vec![bytes[..5].to_vec()]);
        codec.get_mut().eof = true;
        assert!(matches!(poll_frame(&mut codec), Poll::Ready(Some(Err(_)))));
    }

    #[test]
    fn the_write_buffer_exists_from_the_first_frame_until_it_is_written() {
        let waker = waker();
        let mut cx = Context::from_waker(&waker);
        let mut codec = codec(vec![]);
        assert!(codec.poll_ready(&mut cx).is_ready());
        codec.buffer(Ping::new([5; 8]).into()).unwrap();
        assert!(write_capacity(&mut codec) > 0);
        // Not written yet: kept.
        codec.release_idle_write_buffer();
        assert!(write_capacity(&mut codec) > 0);
        assert!(codec.flush(&mut cx).is_ready());
        assert_eq!(codec.get_mut().written, ping_bytes(5));
        codec.release_idle_write_buffer();
        assert_eq!(write_capacity(&mut codec), 0);
        // The next frame allocates it again.
        assert!(codec.poll_ready(&mut cx).is_ready());
        codec.buffer(Ping::new([6; 8]).into()).unwrap();
        assert!(codec.flush(&mut cx).is_ready());
        let mut expected = ping_bytes(5);
        expected.extend(ping_bytes(6));
        assert_eq!(codec.get_mut().written, expected);
    }

    #[test]
    fn the_write_buffer_is_kept_while_the_peer_is_not_reading() {
        let waker = waker();
        let mut cx = Context::from_waker(&waker);
        let mut codec = codec(vec![]);
        codec.get_mut().write_room = 10;
        assert!(codec.poll_ready(&mut cx).is_ready());
        codec.buffer(Ping::new([8; 8]).into()).unwrap();
        assert!(codec.flush(&mut cx).is_pending());
        codec.release_idle_write_buffer();
        assert!(write_capacity(&mut codec) > 0);
        // A DATA frame large enough to be written from its own buffer is
        // kept too until it is written.
        codec.get_mut().write_room = usize::MAX;
        assert!(codec.flush(&mut cx).is_ready());
        assert!(codec.poll_ready(&mut cx).is_ready());
        codec.get_mut().write_room = 100;
        let payload = Bytes::from(vec![1; 4096]);
        let data = frame::Data::new(StreamId::from(1), payload);
        codec.buffer(Frame::Data(data)).unwrap();
        assert!(codec.flush(&mut cx).is_pending());
        codec.release_idle_write_buffer();
        assert!(write_capacity(&mut codec) > 0);
        codec.get_mut().write_room = usize::MAX;
        assert!(codec.flush(&mut cx).is_ready());
        codec.release_idle_write_buffer();
        assert_eq!(write_capacity(&mut codec), 0);
        assert_eq!(codec.get_mut().written.len(), 17 + 9 + 4096);
    }
}
