//! sideway's -sys crate links a static shim named `libibverbs.a`/`librdmacm.a` (it dlopens the
//! real libraries) and puts its directory first on the search path, so rdma-pool's `-libverbs`
//! finds the shim, which lacks some verbs (`ibv_rereg_mr`). Name the system's shared libraries
//! explicitly: the shim's symbols still win where both define one (they forward to the same
//! shared library), the rest come from the real one.
fn main() {
    println!("cargo:rustc-link-arg=-Wl,--push-state,--no-as-needed");
    println!("cargo:rustc-link-arg=-l:libibverbs.so.1");
    println!("cargo:rustc-link-arg=-l:librdmacm.so.1");
    println!("cargo:rustc-link-arg=-Wl,--pop-state");
}
