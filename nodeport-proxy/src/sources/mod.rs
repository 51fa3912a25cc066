//! Stage 1, sources: where Services and EndpointSlices come from (a file or
//! inline inventory, or the API server) and how they are read.

pub mod kube;
pub mod source;
pub mod yaml_items;
