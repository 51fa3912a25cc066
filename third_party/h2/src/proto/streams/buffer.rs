use slab::Slab;

/// Buffers frames for multiple streams.
#[derive(Debug)]
pub struct Buffer<T> {
    slab: Slab<Slot<T>>,
}

/// A sequence of frames in a `Buffer`
#[derive(Debug)]
pub struct Deque {
    indices: Option<Indices>,
}

/// Tracks the head & tail for a sequence of frames in a `Buffer`.
#[derive(Debug, Default, Copy, Clone)]
struct Indices {
    head: usize,
    tail: usize,
}

#[derive(Debug)]
struct Slot<T> {
    value: T,
    next: Option<usize>,
}

impl<T> Buffer<T> {
    pub fn new() -> Self {
        Buffer { slab: Slab::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.slab.is_empty()
    }

    /// Gives the buffer's memory back if it holds no frame: an idle
    /// connection then holds none (the slab kept the capacity of its
    /// busiest moment for the connection's life).
    pub fn release_if_empty(&mut self) {
        if self.slab.is_empty() && self.slab.capacity() > 0 {
            self.slab = Slab::new();
        }
    }
}

impl Deque {
    pub fn new() -> Self {
        Deque { indices: None }
    }

    pub fn is_empty(&self) -> bool {
        self.indices.is_none()
    }

    pub fn push_back<T>(&mut self, buf: &mut Buffer<T>, value: T) {
        let key = buf.slab.insert(Slot { value, next: None });

        match self.indices {
            Some(ref mut idxs) => {
                buf.slab[idxs.tail].next = Some(key);
                idxs.tail = key;
            }
            None => {
                self.indices = Some(Indices {
                    head: key,
                    tail: key,
                });
            }
        }
    }

    pub fn push_front<T>(&mut self, buf: &mut Buffer<T>, value: T) {
        let key = buf.slab.insert(Slot { value, next: None });

        match self.indices {
            Some(ref mut idxs) => {
                buf.slab[key].next = Some(idxs.head);
                idxs.head = key;
            }
            None => {
                self.indices = Some(Indices {
                    head: key,
                    tail: key,
                });
            }
        }
    }

    pub fn pop_front<T>(&mut self, buf: &mut Buffer<T>) -> Option<T> {
        match self.indices {
            Some(mut idxs) => {
                let mut slot = buf.slab.remove(idxs.head);

                if idxs.head == idxs.tail {
                    assert!(slot.next.is_none());
                    self.indices = None;
                } else {
                    idxs.head = slot.next.take().unwrap();
                    self.indices = Some(idxs);
                }

                Some(slot.value)
            }
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_emptied_buffer_gives_its_memory_back() {
        let mut buf = Buffer::new();
        let mut a = Deque::new();
        let mut b = Deque::new();
        for i in 0..5 {
            a.push_back(&mut buf, i);
            b.push_back(&mut buf, i + 10);
        }
        assert!(buf.slab.capacity() >= 10);
        buf.release_if_empty();
        assert!(buf.slab.capacity() >= 10, "frames are queued: kept");
        for i in 0..5 {
            assert_eq!(a.pop_front(&mut buf), Some(i));
        }
        buf.release_if_empty();
        assert!(buf.slab.capacity() >= 10, "b's frames are queued: kept");
        for i in 0..5 {
            assert_eq!(b.pop_front(&mut buf), Some(i + 10));
        }
        buf.release_if_empty();
        assert_eq!(buf.slab.capacity(), 0);
        a.push_back(&mut buf, 7);
        assert_eq!(a.pop_front(&mut buf), Some(7), "usable again");
    }
}
