//! The soft NIC's rules, one test (at least) per rule, on configurations the scenario suite does
//! not cover. Each test fails if its rule is removed from `src/nic/soft/`. One module per group
//! of rules; each module's first line names its rules.

#[path = "../common/mod.rs"]
mod common;

mod concurrency;
mod faults;
mod keys;
mod limits;
mod odp;
mod rc;
mod registration;
mod rereg;
mod umem;
mod windows;
