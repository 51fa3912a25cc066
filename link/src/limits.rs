//! Bounds on what a peer can make the link hold beyond what flow control
//! budgets (those are flags: see `flow` and `h2window`).

/// HTTP/2 control frames (SETTINGS, PING, WINDOW_UPDATE, PRIORITY,
/// RST_STREAM, GOAWAY, empty DATA, unknown types) a client may send on one
/// server connection at once, before [`H2_CONTROL_RATE`] and
/// [`H2_CONTROL_CREDIT`] refill it; past it the connection ends with GOAWAY
/// ENHANCE_YOUR_CALM ([`crate::h2flood`]).
pub const H2_CONTROL_BURST: f64 = 1000.0;

/// Control frames per second a client may send on top of the burst.
pub const H2_CONTROL_RATE: f64 = 100.0;

/// What one SETTINGS frame (not an ACK) spends of the budget, in control
/// frames, plus one per 8 settings in it. A client sends a handful in a
/// connection's life (its preface, a few window changes), but each costs the
/// server more than a PING: h2 reads no further until its ACK is queued, and
/// applies it to every stream. Weighted so, a SETTINGS flood is sent away
/// after 100 frames, not 1,000 (RELIABILITY.md, `floods`).
pub const H2_SETTINGS_COST: f64 = 10.0;

/// Control frames a client earns per DATA frame with data or HEADERS frame
/// either way (WINDOW_UPDATEs and BDP PINGs follow the data).
pub const H2_CONTROL_CREDIT: f64 = 4.0;
