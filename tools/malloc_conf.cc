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
//
// narenas:1: one arena for all threads. By default each thread took one of
// 8 arenas (4 per core), so the memory a fill's thread freed was not reused
// by the emit's or the packing's threads, which faulted in fresh huge pages
// instead - and with the kernel's THP defrag on madvise, a fresh huge page
// may first be compacted for, in the fault (system time 0.05-0.7 s a
// DeepSeek-V3 compile). With one arena (2026-12-05, 9 runs each, interleaved,
// medians): DeepSeek-V3 TP32 11.0k -> 6.6k faults, system time 0.17 -> 0.06 s,
// wall 1.21 -> 1.11 s; Kimi-K2 14.9k -> 9.2k faults; Qwen3-235B 8.5k -> 4.9k.
// The threads are few (the machine's cores) and allocate little in their hot
// loops: user time did not grow (1.76 -> 1.70 s, 7 runs each).

extern "C" {
// NOLINTNEXTLINE: the name and type are jemalloc's
const char* malloc_conf = "thp:always,narenas:1";
}
