// jemalloc's settings for the reshard CLI, linked only where the CLI links
// jemalloc (CMakeLists.txt): jemalloc reads this symbol at its first
// allocation; MALLOC_CONF in the environment still overrides it.
//
// thp:always: jemalloc asks for transparent huge pages on its memory
// (madvise: this machine's kernel gives huge pages only where asked, so
// without it every 4 KiB page of a large compile's hundreds of MB faults in
// on its own). A large compile then takes a small fraction of the page
// faults and less wall time, for a somewhat higher peak memory.
//
// narenas:1: one arena for all threads. By default each thread takes one of
// four arenas per core, so the memory a fill's thread frees is not reused by
// the emit's or the packing's threads, which fault in fresh huge pages
// instead - and with the kernel's THP defrag on madvise, a fresh huge page
// may first be compacted for, in the fault (system time). With one arena a
// large compile takes fewer faults, less system time and less wall time.
// The threads are few (the machine's cores) and allocate little in their hot
// loops: user time does not grow.

extern "C" {
// NOLINTNEXTLINE: the name and type are jemalloc's
const char* malloc_conf = "thp:always,narenas:1";
}
