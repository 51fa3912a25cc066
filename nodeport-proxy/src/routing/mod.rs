//! Stage 2, the routing table: KKP's rules turn the inventory into a plan
//! (kept up to date change by change by the index), the plan becomes the
//! routing table the listeners read, swapped atomically by the store.

pub mod expose;
pub mod index;
pub mod model;
pub mod names;
pub mod plan;
pub mod policy;
pub(crate) mod shards;
pub mod store;
pub mod table;
