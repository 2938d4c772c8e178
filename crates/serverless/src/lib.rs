//! Serverless building blocks that do not depend on the proxy: how an instance is started,
//! stopped, frozen and scaled ([`driver`]), when to scale ([`autoscale`]), and where usage is
//! recorded ([`ledger`]). The lifecycle that ties them to client sessions lives in
//! `holdfast_proxy::serverless`.

pub mod autoscale;
pub mod driver;
pub mod ledger;
