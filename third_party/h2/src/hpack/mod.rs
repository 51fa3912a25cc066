mod decoder;
mod encoder;
pub(crate) mod header;
pub(crate) mod huffman;
mod table;

#[cfg(test)]
mod test;

pub use self::decoder::{Decoder, DecoderError, NeedMore};
pub use self::encoder::Encoder;
pub use self::header::{BytesStr, Header};

/// Makes room for one more entry in a dynamic table. The first entries get
/// exactly the room they need: a connection's table usually holds a handful
/// of entries (its peer's first headers) for the connection's life, and a
/// `VecDeque` that doubles from 4 keeps up to half of its room unused. Past
/// `EXACT_UP_TO` entries it doubles as before.
fn reserve_entry<T>(entries: &mut std::collections::VecDeque<T>) {
    const EXACT_UP_TO: usize = 16;
    if entries.len() == entries.capacity() && entries.len() < EXACT_UP_TO {
        entries.reserve_exact(1);
    }
}

#[cfg(test)]
mod reserve_tests {
    #[test]
    fn small_tables_hold_the_room_they_use() {
        let mut entries = std::collections::VecDeque::new();
        for n in 1..=20usize {
            super::reserve_entry(&mut entries);
            entries.push_front(n);
            if n <= 16 {
                assert_eq!(entries.capacity(), n);
            } else {
                assert!(entries.capacity() >= n);
            }
        }
    }
}
