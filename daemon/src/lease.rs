//! Lease validity, as the server's garbage collector and the agent's server
//! count must agree on it (upstream's `IsLeaseValid`).

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Whether a Lease is held at `now`: its renew time (else its acquire time)
/// plus its duration is after `now`.
pub fn is_valid(lease: &Lease, now: Timestamp) -> bool {
    let Some(spec) = &lease.spec else {
        return false;
    };
    let Some(last) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return false;
    };
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(0));
    last.0
        .checked_add(SignedDuration::from_secs(secs))
        .is_ok_and(|end| end > now)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    #[test]
    fn renew_time_then_acquire_time_plus_duration() {
        let now = Timestamp::now();
        let ago = |s: i64| MicroTime(now.checked_sub(SignedDuration::from_secs(s)).unwrap());
        let lease = |renew: Option<MicroTime>, acquire: Option<MicroTime>| Lease {
            spec: Some(LeaseSpec {
                lease_duration_seconds: Some(30),
                renew_time: renew,
                acquire_time: acquire,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(is_valid(&lease(Some(ago(10)), None), now));
        assert!(is_valid(&lease(Some(ago(29)), None), now));
        assert!(!is_valid(&lease(Some(ago(30)), None), now));
        assert!(!is_valid(&lease(Some(ago(31)), Some(ago(1))), now));
        assert!(is_valid(&lease(None, Some(ago(1))), now));
        assert!(!is_valid(&lease(None, None), now));
        assert!(!is_valid(&Lease::default(), now));
    }
}
