//! Safe code cannot make the NIC touch memory the program freed or reads: each program in
//! `tests/ui/` must fail to compile, with the error recorded next to it.
//!
//! A crate of its own (`compile-fail/`): trybuild builds the crate under test with all the
//! dev-dependencies of the package the test lives in, and rdma-pool's own (jemalloc and
//! mimalloc from C, criterion, tokio, proptest) took ~3.5 minutes and gigabytes of the CI for
//! programs that need none of them.

#[test]
fn unsound_posts_do_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
