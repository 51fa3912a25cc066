//! The gRPC codec for both services: prost, with small initial buffers.
//!
//! tonic starts every stream's encode and decode buffer at 8 KiB and keeps
//! it. kube-apiserver opens one HTTP/2 connection and one stream per proxied
//! TCP connection, so on a busy server those buffers are most of the memory
//! an idle tunnel costs; they grow on demand for large messages anyway (a
//! DATA packet larger than the buffer gets an allocation of its own size
//! whatever the buffer's first size), so the first size only decides what an
//! idle stream keeps: room for a dial's packets, not more.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// Initial size of a stream's encode and decode buffers: a DIAL_REQ or
/// DIAL_RSP with its 5-byte gRPC header fits (issue 39: 1 KiB each was
/// 2 KiB of every idle tunnel).
pub const INITIAL_BUFFER: usize = 128;
/// tonic's default: encoded messages are flushed once this much is buffered.
pub const YIELD_THRESHOLD: usize = 32 * 1024;

#[derive(Debug, Clone, Copy)]
pub struct PacketCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for PacketCodec<T, U> {
    fn default() -> Self {
        PacketCodec(PhantomData)
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(INITIAL_BUFFER, YIELD_THRESHOLD)
}

impl<T, U> Codec for PacketCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(settings())
    }
}
