//! The figures flow control runs with: what a packet costs, the window
//! bounds and defaults, the offer each side announces, and the settings
//! built from the flags that set them.

use std::time::Duration;

/// Smallest credit a DATA packet costs, whatever its length.
pub const MIN_COST: i64 = 256;
/// Largest gRPC message either side accepts (grpc-go's default).
pub const MAX_PACKET: i64 = 4 << 20;
/// The window every connection gets even when the budget is used up, so it
/// still makes progress (and one stalled reader cannot stop the others).
pub const FLOOR_WINDOW: i64 = 16 << 10;
/// A new connection's window while the budget has room.
pub const DEFAULT_INITIAL_WINDOW: i64 = 256 << 10;
/// How far one connection's window may grow, per direction. A window
/// carries about three quarters of itself per round trip (credit comes back
/// in quarter windows, once the reader has passed the data on): one tunnel
/// at 100 ms moved 113-122 MiB/s with 16 MiB, as grpc-go's 16 MiB allows
/// upstream, and 181-198 MiB/s with 32 MiB (P10). The budgets bound what
/// all windows together may hold.
pub const DEFAULT_MAX_WINDOW: i64 = 32 << 20;
/// Bounds for the window flags and for what a peer may announce.
pub const MIN_WINDOW: i64 = FLOOR_WINDOW;
pub const MAX_WINDOW: i64 = 1 << 30;
/// What a sender with no credit left reads ahead of it, and then holds while
/// it waits: enough that a read overlaps the wait for credit, small enough
/// that a thousand tunnels held back by their readers hold little (P10
/// stalled readers: 64 KiB chunks held by each took the server past its
/// budget).
pub const READ_AHEAD: usize = 16 << 10;
/// How long a window's data may stand still before the window shrinks.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(1);
/// How often windows are checked for shrinking (and budget freed).
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(250);

/// The credit a DATA payload of `len` bytes costs.
pub fn cost(len: usize) -> i64 {
    i64::try_from(len).unwrap_or(i64::MAX).max(MIN_COST)
}

/// The `konnectivity_proto::header::FLOW_CONTROL` value announcing our largest window.
pub fn offer(max_window: i64) -> String {
    format!("v2 max={max_window}")
}

/// Parses a peer's [`offer`]: its largest window, clamped to
/// [`MIN_WINDOW`]..=[`MAX_WINDOW`]. `None` if absent or not understood.
pub fn parse_offer(value: Option<&str>) -> Option<i64> {
    value?
        .trim()
        .strip_prefix("v2 max=")?
        .parse::<i64>()
        .ok()
        .map(|w| w.clamp(MIN_WINDOW, MAX_WINDOW))
}

/// How windows behave on one side of one agent stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowConfig {
    /// A new connection's window while the budget has room.
    pub initial: i64,
    /// The largest window (the smaller of both sides' offers).
    pub max: i64,
    /// How long data may stand still before the window shrinks.
    pub idle: Duration,
}

impl Default for WindowConfig {
    fn default() -> Self {
        WindowConfig {
            initial: DEFAULT_INITIAL_WINDOW,
            max: DEFAULT_MAX_WINDOW,
            idle: DEFAULT_IDLE,
        }
    }
}

impl WindowConfig {
    /// This configuration with the window capped at what the peer offered.
    pub fn agreed(self, peer_max: i64) -> Self {
        let max = self.max.min(peer_max).max(MIN_WINDOW);
        WindowConfig {
            initial: self.initial.clamp(FLOOR_WINDOW, max),
            max,
            idle: self.idle,
        }
    }
}

/// A window's agent stream may hold this much in all (per direction).
pub const DEFAULT_LINK_BUDGET: i64 = 64 << 20;
/// The largest HTTP/2 window of an agent stream (grpc-go's BDP estimator
/// stops at 16 MiB).
pub const DEFAULT_HTTP2_MAX_WINDOW: u32 = 32 << 20;
/// An agent stream's HTTP/2 window to start with.
pub const HTTP2_INITIAL_WINDOW: u32 = 1 << 20;
/// All agent streams of a process together. Sized to fit the shipped memory
/// limits (deploy/: agent 256Mi, server 512Mi) beside their peak RSS under
/// load (soak: agent 57 MiB, server 321 MiB), and still more than one agent
/// link can reserve at full window (64 MiB of tunnel windows + 32 MiB of
/// HTTP/2 window); 16 tunnels at 100 ms carried 7-11 MiB per round trip (P10).
pub const DEFAULT_PROCESS_BUDGET: i64 = 128 << 20;

/// Flow control as configured on one side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowSettings {
    /// Offered to peers of ours (`--flow-control-window` not 0).
    pub enabled: bool,
    pub window: WindowConfig,
    /// What the tunnels of one agent stream may have in flight towards us.
    pub link_budget: i64,
    /// What all tunnels of this process may have in flight towards it.
    pub process_budget: i64,
    /// The largest HTTP/2 window of one agent stream (its connection and
    /// its one stream), for upstream peers too; reserved from the process
    /// budget as it grows.
    pub http2_max_window: u32,
}

impl Default for FlowSettings {
    fn default() -> Self {
        FlowSettings {
            enabled: true,
            window: WindowConfig::default(),
            link_budget: DEFAULT_LINK_BUDGET,
            process_budget: DEFAULT_PROCESS_BUDGET,
            http2_max_window: DEFAULT_HTTP2_MAX_WINDOW,
        }
    }
}

/// Validates the window and budget flags (values in bytes) into settings;
/// `initial` 0 turns flow control off (the process budget still bounds the
/// agent streams' HTTP/2 windows). `names` are the flags' names, in the same
/// order, for the error messages.
pub fn settings_from_flags(
    [initial, max, link_budget, process_budget]: [i64; 4],
    names: [&str; 4],
) -> Result<FlowSettings, String> {
    let budget = |v: i64, name: &str| {
        if v >= FLOOR_WINDOW {
            Ok(v)
        } else {
            Err(format!(
                "--{name} must be at least {FLOOR_WINDOW} bytes, got {v}"
            ))
        }
    };
    if initial == 0 {
        return Ok(FlowSettings {
            enabled: false,
            process_budget: budget(process_budget, names[3])?,
            ..FlowSettings::default()
        });
    }
    let in_range = |v: i64, name: &str| {
        if (MIN_WINDOW..=MAX_WINDOW).contains(&v) {
            Ok(v)
        } else {
            Err(format!(
                "--{name} must be between {MIN_WINDOW} and {MAX_WINDOW} bytes, got {v}"
            ))
        }
    };
    let initial =
        in_range(initial, names[0]).map_err(|e| format!("{e} (or 0 to turn flow control off)"))?;
    let max = in_range(max, names[1])?;
    if max < initial {
        return Err(format!(
            "--{} ({max}) must not be smaller than --{} ({initial})",
            names[1], names[0]
        ));
    }
    Ok(FlowSettings {
        enabled: true,
        window: WindowConfig {
            initial,
            max,
            idle: DEFAULT_IDLE,
        },
        link_budget: budget(link_budget, names[2])?,
        process_budget: budget(process_budget, names[3])?,
        http2_max_window: DEFAULT_HTTP2_MAX_WINDOW,
    })
}

/// Validates an HTTP/2 window flag: 64 KiB (HTTP/2's own) up to 1 GiB.
pub fn http2_window_from_flag(v: i64, name: &str) -> Result<u32, String> {
    const MIN: i64 = 65_535;
    if (MIN..=MAX_WINDOW).contains(&v) {
        Ok(u32::try_from(v).unwrap_or(u32::MAX))
    } else {
        Err(format!(
            "--{name} must be between {MIN} and {MAX_WINDOW} bytes, got {v}"
        ))
    }
}
