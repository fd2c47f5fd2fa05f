//! Safe code cannot make the NIC touch memory the program freed or reads: each program in
//! `tests/ui/` must fail to compile, with the error recorded next to it.

#[test]
fn unsound_posts_do_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
