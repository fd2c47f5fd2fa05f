// A C++ program that never names malloc nor the C API: its memory comes from operator new
// (libstdc++, which calls malloc). Statically linked, nothing would pull the archive's malloc
// in; -Wl,-u,malloc does (pkg-config --static --libs rdma_pool gives it). The check needs no
// reference to the library either: glibc puts small blocks in the [heap] (brk) mapping, the pool
// never does.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

// Whether `p` lies in the process's [heap] (brk) mapping.
static bool in_brk_heap(const void *p) {
    FILE *f = std::fopen("/proc/self/maps", "r");
    char line[512];
    bool in = false;
    while (f && std::fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (std::strstr(line, "[heap]") && std::sscanf(line, "%lx-%lx", &a, &b) == 2)
            in = in || ((uintptr_t)p >= a && (uintptr_t)p < b);
    }
    if (f) std::fclose(f);
    return in;
}

int main() {
    auto small = std::make_unique<std::string>(100, 'y');
    auto v = std::make_unique<std::vector<char>>(1000, 'x');
    bool ok = !in_brk_heap(small.get()) && !in_brk_heap(small->data()) && !in_brk_heap(v->data());
    std::thread t([&] {
        std::vector<int> w(100, 7);
        ok = ok && !in_brk_heap(w.data());
    });
    t.join();
    std::printf("cxx_new: %s\n", ok ? "ok: new is the pool's" : "FAILED: new is glibc's");
    return ok ? 0 : 1;
}
