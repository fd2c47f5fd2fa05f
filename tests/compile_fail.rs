//! Safe code cannot make the NIC touch memory the program freed or reads: each program in
//! `tests/ui/` must fail to compile, with the error recorded next to it.

/// Not again under AddressSanitizer (`scripts/memcheck.sh` builds every test with
/// `--cfg rdma_pool_asan`): a compile error does not depend on the sanitizer, the plain
/// `cargo test` checks these programs, and trybuild's own build of the crate costs ~4.5 minutes
/// of the CI's 90 there.
#[test]
#[cfg_attr(
    rdma_pool_asan,
    ignore = "compile errors do not depend on the sanitizer: checked by the plain cargo test"
)]
fn unsound_posts_do_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
