//! `rdma_pool.h` is what cbindgen makes of the source today: a stale header fails here
//! (`RDMA_POOL_BLESS=1 cargo test -p rdma-pool-capi --test header` rewrites it).

use std::path::Path;

#[test]
fn the_checked_in_header_is_what_cbindgen_generates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut fresh = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses capi/src")
        .write(&mut fresh);
    let fresh = String::from_utf8(fresh).unwrap();
    let path = dir.join("rdma_pool.h");
    if std::env::var_os("RDMA_POOL_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == fresh,
        "capi/rdma_pool.h is stale: run RDMA_POOL_BLESS=1 cargo test -p rdma-pool-capi --test header"
    );
    for f in [
        "rdma_pool_keys_of",
        "rdma_pool_pd",
        "rdma_pool_context",
        "rdma_pool_stats",
        "rdma_pool_grant",
        "rdma_pool_on_completion",
        "rdma_pool_revoke",
        "rdma_pool_grant_free",
    ] {
        assert!(fresh.contains(&format!("{f}(")), "{f} is not in the header");
    }
    assert!(
        !fresh.contains("void *malloc("),
        "the malloc family is libc's to declare"
    );
}
