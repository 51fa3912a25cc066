//! Constructors for the packets both sides send, so `type` and payload are
//! always set together (receivers dispatch on `type`).

use crate::generated::{
    CloseDial, CloseRequest, CloseResponse, Data, DialRequest, DialResponse, Drain, Packet,
    PacketType, WindowUpdate, packet::Payload,
};
use bytes::Bytes;

pub trait PacketExt {
    fn dial_request(protocol: &str, address: &str, random: i64) -> Packet;
    fn dial_response(random: i64, connect_id: i64, error: String) -> Packet;
    fn close_request(connect_id: i64) -> Packet;
    fn close_response(connect_id: i64, error: String) -> Packet;
    fn close_dial(random: i64) -> Packet;
    fn data(connect_id: i64, data: Bytes) -> Packet;
    fn drain() -> Packet;
    /// Credit for the peer (`bytes` > 0), or a request to give some back (< 0).
    fn window_update(connect_id: i64, bytes: i64) -> Packet;
    /// The sender's answer to a request to give credit back.
    fn credit_returned(connect_id: i64, returned: i64) -> Packet;
    /// Sets the initial flow-control window of a DIAL_REQ or DIAL_RSP (0
    /// clears it); other packets are left alone.
    fn set_flow_window(&mut self, window: i64);
    /// The initial flow-control window a DIAL_REQ or DIAL_RSP carries (0: none).
    fn flow_window(&self) -> i64;
    /// Sets the `traceparent` a DIAL_REQ carries to the agent (empty clears
    /// it, and then nothing of it is on the wire); other packets are left
    /// alone.
    fn set_traceparent(&mut self, traceparent: String);
    /// The `type` as the enum, or `None` for a value this build does not know.
    fn kind(&self) -> Option<PacketType>;
    /// Upstream's label for a packet type in metrics (`DIAL_REQ`, …).
    fn type_label(&self) -> &'static str;
}

impl PacketExt for Packet {
    fn dial_request(protocol: &str, address: &str, random: i64) -> Packet {
        Packet {
            r#type: PacketType::DialReq as i32,
            payload: Some(Payload::DialRequest(DialRequest {
                protocol: protocol.to_string(),
                address: address.to_string(),
                random,
                flow_window: 0,
                traceparent: String::new(),
            })),
        }
    }

    fn dial_response(random: i64, connect_id: i64, error: String) -> Packet {
        Packet {
            r#type: PacketType::DialRsp as i32,
            payload: Some(Payload::DialResponse(DialResponse {
                error,
                connect_id,
                random,
                flow_window: 0,
            })),
        }
    }

    fn close_request(connect_id: i64) -> Packet {
        Packet {
            r#type: PacketType::CloseReq as i32,
            payload: Some(Payload::CloseRequest(CloseRequest { connect_id })),
        }
    }

    fn close_response(connect_id: i64, error: String) -> Packet {
        Packet {
            r#type: PacketType::CloseRsp as i32,
            payload: Some(Payload::CloseResponse(CloseResponse { error, connect_id })),
        }
    }

    fn close_dial(random: i64) -> Packet {
        Packet {
            r#type: PacketType::DialCls as i32,
            payload: Some(Payload::CloseDial(CloseDial { random })),
        }
    }

    fn data(connect_id: i64, data: Bytes) -> Packet {
        Packet {
            r#type: PacketType::Data as i32,
            payload: Some(Payload::Data(Data {
                connect_id,
                error: String::new(),
                data,
            })),
        }
    }

    fn drain() -> Packet {
        Packet {
            r#type: PacketType::Drain as i32,
            payload: Some(Payload::Drain(Drain {})),
        }
    }

    fn window_update(connect_id: i64, bytes: i64) -> Packet {
        Packet {
            r#type: PacketType::WindowUpdate as i32,
            payload: Some(Payload::WindowUpdate(WindowUpdate {
                connect_id,
                bytes,
                returned: 0,
            })),
        }
    }

    fn credit_returned(connect_id: i64, returned: i64) -> Packet {
        Packet {
            r#type: PacketType::WindowUpdate as i32,
            payload: Some(Payload::WindowUpdate(WindowUpdate {
                connect_id,
                bytes: 0,
                returned,
            })),
        }
    }

    fn set_flow_window(&mut self, window: i64) {
        match &mut self.payload {
            Some(Payload::DialRequest(r)) => r.flow_window = window,
            Some(Payload::DialResponse(r)) => r.flow_window = window,
            _ => {}
        }
    }

    fn flow_window(&self) -> i64 {
        match &self.payload {
            Some(Payload::DialRequest(r)) => r.flow_window,
            Some(Payload::DialResponse(r)) => r.flow_window,
            _ => 0,
        }
    }

    fn set_traceparent(&mut self, traceparent: String) {
        if let Some(Payload::DialRequest(r)) = &mut self.payload {
            r.traceparent = traceparent;
        }
    }

    fn kind(&self) -> Option<PacketType> {
        PacketType::try_from(self.r#type).ok()
    }

    fn type_label(&self) -> &'static str {
        self.kind().map_or("Unknown", |k| k.as_str_name())
    }
}

impl Packet {
    /// DATA with a copy of `data` (tests and non-hot paths).
    pub fn data_copy(connect_id: i64, data: &[u8]) -> Packet {
        <Packet as PacketExt>::data(connect_id, Bytes::copy_from_slice(data))
    }
}
