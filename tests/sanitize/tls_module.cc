// A module with one small thread_local, loaded by tls_leak_check.cc. Its
// block of dynamic TLS is what glibc allocates with malloc on a thread's first
// use, as it does for libreshard_simgrid.so's thread_locals in `reshard
// simulate`.
thread_local char block[40];

extern "C" char* TouchBlock() {
  block[0] = 1;
  return block;
}
