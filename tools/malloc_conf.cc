// jemalloc's settings for the reshard CLI, linked only where the CLI links
// jemalloc (CMakeLists.txt): jemalloc reads this symbol at its first
// allocation; MALLOC_CONF in the environment still overrides it.
//
// thp:always: jemalloc asks for transparent huge pages on its memory
// (madvise: this machine's kernel gives huge pages only where asked, so
// without it every 4 KiB page of a large compile's 400 MB faulted in on its
// own). Medians, interleaved with the binary without it: DeepSeek-V3 TP32
// 168k page faults -> 11k, 2.52 -> 2.34 s (11 runs each); Kimi-K2 326k ->
// 14k faults, 4.78 -> 3.88 s (5 runs). Peak memory (one run each): 367 ->
// 459 MiB and 612 -> 766 MiB (README, issue 32).

extern "C" {
// NOLINTNEXTLINE: the name and type are jemalloc's
const char* malloc_conf = "thp:always";
}
