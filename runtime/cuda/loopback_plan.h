// A two-rank plan whose rank 1 mirrors rank 0 (same buffers and data, peer 0
// instead of 1): with every message looped back to the sender, rank 0 alone
// receives what rank 1 would have sent, so one process with a one-rank NCCL
// communicator (or the CPU loopback of hooks_test.cc) replays a real program.
// It covers every copy the device path has: memcpy, memcpy2d, converting,
// transposing and buffer-selecting kernels, direct send/recv, both channels.
#pragma once

#include "runtime/test.h"

namespace reshard::testing {

inline PlanSpec LoopbackPlan() {
  using K = fb::StepKind;
  using D = fb::Dtype;
  const fb::Channel nvlink = fb::Channel::nvlink;
  PlanSpec spec;
  spec.tensors.push_back({"w", D::bf16, {0, 0}, {64, 96}});
  spec.tensors.push_back({"e", D::fp32, {0, 0, 0}, {4, 8, 32}});
  for (uint32_t rank = 0; rank < 2; ++rank) {
    const uint32_t peer = 1 - rank;
    ProgramSpec p;
    p.rank = rank;
    p.buffers = {{"w", D::bf16, {64, 96}},  {"cols", D::fp16, {64, 32}}, {"rows", D::bf16, {16, 96}},
                 {"wt", D::fp32, {48, 64}}, {"tail", D::bf16, {64, 16}}, {"e.0", D::fp32, {8, 32}},
                 {"e.1", D::fp32, {8, 32}}, {"e.2", D::fp32, {8, 32}},   {"e.3", D::fp32, {8, 32}},
                 {"e.stacked", D::bf16, {4, 8, 32}}, {"wcopy", D::fp16, {8, 64}}};
    p.fragments.push_back(MakeFragment(0, 0, 0, {0, 0}, {64, 96}, {96, 1}, 0));
    p.fragments.push_back(MakeFragment(0, 1, 0, {0, 48}, {64, 80}, {32, 1}, 1));
    p.fragments.push_back(MakeFragment(0, 2, 0, {16, 0}, {32, 96}, {96, 1}, 1));
    p.fragments.push_back(MakeFragment(0, 3, 0, {0, 0}, {64, 48}, {1, 64}, 1));
    p.fragments.push_back(MakeFragment(0, 4, 0, {0, 80}, {64, 96}, {16, 1}, 1));
    for (uint32_t e = 0; e < 4; ++e) p.fragments.push_back(MakeFragment(1, 5 + e, 0, {e, 0, 0}, {e + 1, 8, 32}, {0, 32, 1}, 0));
    p.fragments.push_back(MakeFragment(1, 9, 0, {0, 0, 0}, {4, 8, 32}, {256, 32, 1}, 1));
    p.fragments.push_back(MakeFragment(0, 10, 0, {0, 0}, {64, 8}, {1, 64}, 1));
    p.staging_bytes = 40960;
    // Round 0: columns 48..80 packed to fp16 (kernel), unpacked by memcpy;
    // rows 16..32 straight from buffer to buffer over nvlink.
    p.Step(MakeStep(K::pack, kNone, p.Region(MakeRegion(0, 48, {64, 32}, {96, 1})), kNone, 0, 4096, D::fp16));
    p.Step(MakeStep(K::send, peer, kNone, kNone, 0, 4096, D::fp16));
    p.Step(MakeStep(K::send, peer, p.Region(MakeRegion(0, 1536, {16, 96}, {96, 1})), kNone, 0, 3072, D::bf16, nvlink));
    p.Step(MakeStep(K::recv, peer, kNone, kNone, 4096, 4096, D::fp16));
    p.Step(MakeStep(K::recv, peer, kNone, p.Region(MakeRegion(2, 0, {1536}, {1})), 0, 3072, D::bf16, nvlink));
    p.Step(MakeStep(K::unpack, kNone, kNone, p.Region(MakeRegion(1, 0, {64, 32}, {32, 1})), 4096, 4096, D::fp16));
    // Round 1: columns 0..48 transposed to fp32 (kernel); columns 80..96 as
    // rows (memcpy2d) over nvlink, unpacked from a staging region; the four
    // expert buffers through one buffer-selecting region, narrowed to bf16; a
    // local transposing copy.
    p.Round();
    p.Step(MakeStep(K::pack, kNone, p.Region(MakeRegion(0, 0, {48, 64}, {1, 96})), kNone, 8192, 12288, D::fp32));
    p.Step(MakeStep(K::pack, kNone, p.Region(MakeRegion(0, 80, {64, 16}, {96, 1})), kNone, 32768, 2048, D::bf16));
    p.Step(MakeStep(K::pack, kNone, p.Region(MakeRegion(5, 0, {4, 8, 32}, {1, 32, 1}, 0b001)), kNone, 36864, 2048,
                    D::bf16));
    p.Step(MakeStep(K::copy, kNone, p.Region(MakeRegion(0, 0, {64, 8}, {96, 1})),
                    p.Region(MakeRegion(10, 0, {64, 8}, {1, 64})), 0, 0, D::bf16));
    p.Step(MakeStep(K::send, peer, kNone, kNone, 8192, 12288, D::fp32));
    p.Step(MakeStep(K::send, peer, kNone, kNone, 32768, 2048, D::bf16, nvlink));
    p.Step(MakeStep(K::send, peer, kNone, kNone, 36864, 2048, D::bf16));
    p.Step(MakeStep(K::recv, peer, kNone, kNone, 20480, 12288, D::fp32));
    p.Step(MakeStep(K::recv, peer, kNone, kNone, 34816, 2048, D::bf16, nvlink));
    p.Step(MakeStep(K::recv, peer, kNone, kNone, 38912, 2048, D::bf16));
    p.Step(MakeStep(K::unpack, kNone, kNone, p.Region(MakeRegion(3, 0, {48, 64}, {64, 1})), 20480, 12288, D::fp32));
    p.Step(MakeStep(K::unpack, kNone, p.Region(StagingRegion(17408, {64, 16}, {16, 1})),
                    p.Region(MakeRegion(4, 0, {64, 16}, {16, 1})), 34816, 2048, D::bf16));
    p.Step(MakeStep(K::unpack, kNone, kNone, p.Region(MakeRegion(9, 0, {1024}, {1})), 38912, 2048, D::bf16));
    spec.programs.push_back(p);
  }
  return spec;
}

}  // namespace reshard::testing
