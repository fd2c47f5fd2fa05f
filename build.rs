//! Link the verbs libraries by their shared-object names as well as by `-libverbs`/`-lrdmacm`
//! (rdma-sys's): another crate of the same program may put a static shim named
//! `libibverbs.a` first on the search path (sideway's rdma-mummy-sys does), and `-libverbs`
//! would then find the shim, which lacks verbs this crate calls (`ibv_rereg_mr`). Named
//! verbatim, the system's shared libraries always come in; where the shim defines a symbol
//! too, it forwards to the same shared library.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_VERBS").is_some() {
        println!("cargo:rustc-link-lib=dylib:+verbatim=libibverbs.so.1");
        println!("cargo:rustc-link-lib=dylib:+verbatim=librdmacm.so.1");
    }
}
