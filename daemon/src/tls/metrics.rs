//! The TLS reload metrics' names of a binary, from its metric prefix: the
//! families' endings and HELP are the same for every binary that reloads its
//! TLS files ([`crate::tls::reload::MetricNames`]).

/// `tls_metric_names!("konnectivity_network_proxy_server")` names
/// `<prefix>_certificate_expiration_timestamp_seconds` and
/// `<prefix>_tls_reloads_total`, as a constant
/// [`crate::tls::reload::MetricNames`].
#[macro_export]
macro_rules! tls_metric_names {
    ($prefix:literal) => {
        $crate::tls::reload::MetricNames {
            expiry: concat!($prefix, "_certificate_expiration_timestamp_seconds"),
            reloads: concat!($prefix, "_tls_reloads_total"),
        }
    };
}
