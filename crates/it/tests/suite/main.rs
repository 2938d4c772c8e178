//! holdfast against real MariaDB with real clients. One binary, one lab per test (nextest
//! runs every test in its own process).

mod admin;
mod admin_auth;
mod bad_input;
mod cli;
mod client_address;
mod commit_markers;
mod compression;
mod desync;
mod differential;
mod durability;
mod first_hour;
mod floods;
mod ha;
mod ha_admin;
mod keepalive;
mod kernel_relay;
mod kill;
mod lost_statements;
mod mariadb_caps;
mod netcut;
mod nodes;
mod parity;
mod passwords;
mod proxy_protocol_in;
mod python;
mod read_only;
mod reload;
mod replay;
mod restore;
mod rust_client;
mod serverless;
mod session;
mod split;
mod sysbench;
mod tls;
