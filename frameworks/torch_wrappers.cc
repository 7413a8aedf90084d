#include "frameworks/torch_wrappers.h"

namespace reshard {

std::string WithoutWrapperSegments(const std::string& name) {
  static const char* const kSegments[] = {"_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module."};
  std::string out = name;
  for (const char* seg : kSegments) {
    const std::string s = seg;
    // A segment is a whole dotted component: at the start or after a dot.
    for (size_t at = out.find(s); at != std::string::npos; at = out.find(s, at)) {
      if (at == 0 || out[at - 1] == '.') out.erase(at, s.size());
      else at += s.size();
    }
  }
  return out;
}

}  // namespace reshard
