//! The gRPC codec for both services: prost, with small initial buffers.
//!
//! tonic starts every stream's encode and decode buffer at 8 KiB and keeps
//! it. kube-apiserver opens one HTTP/2 connection and one stream per proxied
//! TCP connection, so on a busy server those buffers are most of the memory
//! an idle tunnel costs; they grow on demand for large messages anyway.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// Initial size of a stream's encode and decode buffers.
pub const INITIAL_BUFFER: usize = 1024;
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
