//! The C library as C programs use it: the test programs of `tests/c/` compiled with the
//! system's `cc` and run under `LD_PRELOAD=librdma_pool.so`, linked against it and linked
//! statically; and programs from the machine (`python3`, `sqlite3`, `gcc`, `sh`) run under
//! `LD_PRELOAD`, their results compared with a run without it.
//!
//! The library is `target/<profile>/librdma_pool.so`, which `cargo test` does not build (a
//! cdylib is no dependency of a test): `cargo build -p rdma-pool-capi` first, as
//! `scripts/test.sh` does. A library older than the sources fails here rather than test old
//! code.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

/// The newest modification time of the files under `dir`.
fn newest(dir: &Path) -> std::time::SystemTime {
    let mut t = std::time::UNIX_EPOCH;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = e.metadata().unwrap();
        let this = if m.is_dir() {
            newest(&e.path())
        } else {
            m.modified().unwrap()
        };
        t = t.max(this);
    }
    t
}

/// `target/<profile>`: where cargo put `librdma_pool.so` and `.a` (this binary is in `deps/`).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let built = std::fs::metadata(dir.join("librdma_pool.so"))
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "no librdma_pool.so in {}: run `cargo build -p rdma-pool-capi` first",
                dir.display()
            )
        });
    let src = newest(&capi_dir().join("src")).max(newest(&capi_dir().join("../src")));
    assert!(
        built >= src,
        "librdma_pool.so in {} is older than the sources: run `cargo build -p rdma-pool-capi`",
        dir.display()
    );
    dir
}

fn so() -> PathBuf {
    lib_dir().join("librdma_pool.so")
}

fn capi_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The native libraries the static library needs besides libc (`rustc --print
/// native-static-libs`, and libibverbs/librdmacm).
const STATIC_LIBS: &[&str] = &[
    // Nothing may reference `malloc` itself (a C++ program's `new` calls it from libstdc++):
    // this pulls the archive's in.
    "-Wl,-u,malloc",
    "-libverbs",
    "-lrdmacm",
    "-lgcc_s",
    "-lutil",
    "-lrt",
    "-lpthread",
    "-lm",
    "-ldl",
];

#[derive(Clone, Copy, Debug)]
enum Link {
    /// Not linked: run under `LD_PRELOAD` (the API resolves through weak symbols).
    Preload,
    /// Linked against `librdma_pool.so`.
    Shared,
    /// Linked with `librdma_pool.a`.
    Static,
}

/// Compile `tests/c/<name>.c` as `link` says; the executable's path.
fn compile(name: &str, link: Link) -> PathBuf {
    compile_with("cc", &format!("{name}.c"), link)
}

/// Compile `tests/c/<file>` with `compiler` as `link` says; the executable's path.
fn compile_with(compiler: &str, file: &str, link: Link) -> PathBuf {
    let name = file.split('.').next().unwrap();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{link:?}"));
    let src = capi_dir().join("tests/c").join(file);
    let mut cc = Command::new(compiler);
    cc.args(["-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-I"])
        .arg(capi_dir())
        .arg("-o")
        .arg(&out)
        .arg(&src);
    match link {
        Link::Preload => {
            cc.arg("-libverbs").arg("-ldl");
        }
        Link::Shared => {
            let d = lib_dir();
            cc.arg(format!("-L{}", d.display()))
                .arg("-lrdma_pool")
                .arg(format!("-Wl,-rpath,{}", d.display()))
                .arg("-libverbs");
        }
        Link::Static => {
            cc.arg(lib_dir().join("librdma_pool.a")).args(STATIC_LIBS);
        }
    }
    let o = cc.output().expect("cc runs (build-essential)");
    assert!(
        o.status.success(),
        "cc {name} ({link:?}) failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Run `cmd` (under `LD_PRELOAD` when `preload`); its output, checked for success.
fn run(mut cmd: Command, preload: bool) -> Output {
    if preload {
        cmd.env("LD_PRELOAD", so());
    }
    let what = format!("{cmd:?}");
    let o = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        o.status.success(),
        "{what} failed ({:?}):\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn the_malloc_family_preloaded_linked_and_static() {
    for (link, preload) in [
        (Link::Preload, true),
        (Link::Shared, false),
        (Link::Static, false),
    ] {
        let exe = compile("malloc_family", link);
        let o = run(Command::new(&exe), preload);
        let out = stdout(&o);
        assert!(out.contains("malloc_family: ok"), "{link:?}: {out}");
        eprintln!("{link:?}: {}", out.trim());
    }
}

#[test]
fn a_cxx_program_linked_statically_gets_its_new_from_the_pool() {
    let exe = compile_with("g++", "cxx_new.cpp", Link::Static);
    let out = stdout(&run(Command::new(&exe), false));
    assert!(out.contains("cxx_new: ok"), "{out}");
}

#[test]
fn a_program_without_the_library_is_not_served_by_it() {
    // The weak API is absent without the preload: the program says so (exit 1) instead of
    // passing — so the test above really ran on the library.
    let exe = compile("malloc_family", Link::Preload);
    let o = Command::new(&exe).output().unwrap();
    assert!(!o.status.success());
}

#[test]
fn threads_thread_exit_fork_and_exec() {
    for (link, preload) in [(Link::Preload, true), (Link::Static, false)] {
        let exe = compile("threads_fork", link);
        let mut cmd = Command::new(&exe);
        cmd.arg("20");
        let out = stdout(&run(cmd, preload));
        assert!(out.contains("threads_fork: ok"), "{link:?}: {out}");
        eprintln!("{link:?}: {}", out.trim());
    }
}

/// Run a program that needs a verbs device: on one (the rxe guest runs these programs too) it
/// must pass whole; here, without one, it must say the pool has no verbs objects (exit 3) —
/// never crash or pass silently.
fn run_verbs_program(name: &str) {
    let exe = compile(name, Link::Static);
    let verbs = std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
    let soft = std::env::var("RDMA_POOL_NIC").is_ok_and(|v| v == "soft");
    let o = Command::new(&exe).output().unwrap();
    let out = stdout(&o);
    if verbs && !soft {
        assert!(
            o.status.success(),
            "{out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
    } else {
        assert_eq!(o.status.code(), Some(3), "{out}");
        assert!(out.contains("no verbs device"), "{out}");
    }
}

#[test]
fn the_rdma_program_answers_enodev_on_the_soft_nic() {
    run_verbs_program("rdma_app");
}

#[test]
fn the_readme_example_is_this_program() {
    let readme = std::fs::read_to_string(capi_dir().join("../README.md")).unwrap();
    let src = std::fs::read_to_string(capi_dir().join("tests/c/readme.c")).unwrap();
    assert!(
        readme.contains(&format!("```c\n{src}```")),
        "README.md's C example differs from capi/tests/c/readme.c"
    );
    run_verbs_program("readme");
}

/// A Python workload, its buffers checked through the C API from inside Python.
const PY: &str = r#"
import ctypes, json, zlib, hashlib
data = [{"k": i, "v": str(i) * (i % 50), "l": list(range(i % 30))} for i in range(30000)]
text = json.dumps(data)
packed = zlib.compress(text.encode())
assert json.loads(zlib.decompress(packed)) == data
print(len(text), hashlib.sha256(text.encode()).hexdigest())
keys_of = getattr(ctypes.CDLL(None), "rdma_pool_keys_of", None)
if keys_of:
    keys_of.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32)]
    buf = bytearray(1 << 20)
    l, r = ctypes.c_uint32(), ctypes.c_uint32()
    addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    assert keys_of(addr, len(buf), ctypes.byref(l), ctypes.byref(r)) == 0, "bytearray not registered"
    print("registered")
"#;

#[test]
fn python_runs_unchanged_and_its_heap_is_registered() {
    let py = |preload| {
        let mut c = Command::new("python3");
        c.args(["-c", PY]);
        stdout(&run(c, preload))
    };
    let want = py(false);
    assert!(!want.contains("registered"));
    assert_eq!(py(true), format!("{want}registered\n"));
}

#[test]
fn sqlite3_gives_the_same_answers() {
    let sql = "create table t(a integer, b text);\n\
        with recursive c(x) as (select 1 union all select x + 1 from c where x < 20000)\n\
        insert into t select x, hex(randomblob(20)) || x from c;\n\
        create index i on t(b);\n\
        select count(*), sum(a), sum(length(b)) from t where a % 7 = 3;\n\
        select a from t order by b limit 1 offset 0;\n";
    let db = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sqlite-test.db");
    let go = |preload: bool| {
        let _ = std::fs::remove_file(&db);
        let mut c = Command::new("sqlite3");
        // Deterministic: the first query does not depend on randomblob.
        c.arg(&db)
            .arg(sql.replace("select a from t order by b limit 1 offset 0;\n", ""));
        stdout(&run(c, preload))
    };
    assert_eq!(go(true), go(false));
}

#[test]
fn gcc_compiles_and_the_shell_pipes_under_the_library() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let src = dir.join("hello.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <stdlib.h>\nint main(void){char*p=malloc(64);\
         snprintf(p,64,\"%d\",6*7);puts(p);free(p);return 0;}\n",
    )
    .unwrap();
    let exe = dir.join("hello");
    let mut cc = Command::new("gcc");
    cc.arg("-O2").arg("-o").arg(&exe).arg(&src);
    run(cc, true); // gcc → cc1, as, collect2, ld: every child loads the library
    assert_eq!(stdout(&run(Command::new(&exe), true)), "42\n");
    let mut sh = Command::new("/bin/sh");
    sh.args(["-c", "seq 1 5000 | sort -r | head -n 3 | tr '\\n' ' '"]);
    assert_eq!(stdout(&run(sh, true)), "999 998 997 ");
}

#[test]
fn loading_the_library_costs_little() {
    // Measured, not asserted (timings are the benchmarks' business): `/bin/true` does not
    // allocate, so nothing initialises.
    let time = |preload: bool| {
        let t = Instant::now();
        for _ in 0..20 {
            run(Command::new("/bin/true"), preload);
        }
        t.elapsed() / 20
    };
    let (without, with) = (time(false), time(true));
    eprintln!("/bin/true: {without:?} without, {with:?} with LD_PRELOAD");
}
